import { createHash } from 'node:crypto';
import type { z } from 'zod';
import type {
  BridgeErrorKind,
  WireContact,
  WireConversation,
  WireFile,
  WireGroup,
  WireMessage,
} from '../../../src/connectors/bridge/wire.ts';

type Contact = z.output<typeof WireContact>;
type Group = z.output<typeof WireGroup>;
type Conversation = z.output<typeof WireConversation>;
type Message = z.output<typeof WireMessage>;
type FileMeta = z.output<typeof WireFile>;

/** What the reference messenger holds; tests may pass their own. */
export interface ReferenceSeed {
  contacts: Omit<Contact, 'confidence' | 'raw_ref'>[];
  groups: (Omit<Group, 'confidence' | 'raw_ref' | 'member_count'> & { members: string[] })[];
  /** A direct conversation names its contact; a group conversation its group. */
  conversations: (Conversation & { contact_id?: string; group_id?: string })[];
  /** Attachments are the files that name the message. */
  messages: Omit<Message, 'raw_ref' | 'attachments'>[];
  files: (Omit<FileMeta, 'sha256' | 'size_bytes'> & { content: string })[];
}

export function defaultSeed(): ReferenceSeed {
  const contact = (
    c: Partial<ReferenceSeed['contacts'][number]> & { contact_id: string; display_name: string },
  ) => ({
    account: null,
    department: null,
    title: null,
    active: true,
    ...c,
  });
  return {
    contacts: [
      contact({ contact_id: 'u-anna', display_name: 'Anna Schmidt', account: 'anna.s', department: 'Legal' }),
      contact({ contact_id: 'u-yuki', display_name: '佐藤由紀', account: 'yuki.sato', title: 'エンジニア' }),
      contact({
        contact_id: 'u-omar',
        display_name: 'عمر الفاروق',
        account: 'omar.f',
        department: 'Finance',
      }),
      contact({ contact_id: 'u-chris1', display_name: 'Chris Lee', account: 'chris.lee' }),
      contact({ contact_id: 'u-chris2', display_name: 'Chris Lee', account: 'c.lee' }),
      contact({ contact_id: 'u-lea', display_name: 'Léa Moreau', account: 'lea.m', active: false }),
    ],
    groups: [
      {
        group_id: 'g-ops',
        display_name: 'Ops Desk',
        owner_ref: 'u-anna',
        archived: false,
        members: ['u-anna', 'u-omar'],
      },
      {
        group_id: 'g-lectorium',
        display_name: 'Лекторий',
        owner_ref: 'u-yuki',
        archived: false,
        members: ['u-yuki'],
      },
      { group_id: 'g-old', display_name: 'Ops Archive', owner_ref: null, archived: true, members: [] },
    ],
    conversations: [
      {
        conversation_id: 'c-anna',
        conversation_type: 'direct',
        display_name: 'Anna Schmidt',
        contact_id: 'u-anna',
      },
      { conversation_id: 'c-ops', conversation_type: 'group', display_name: 'Ops Desk', group_id: 'g-ops' },
      {
        conversation_id: 'c-lectorium',
        conversation_type: 'group',
        display_name: 'Лекторий',
        group_id: 'g-lectorium',
      },
    ],
    messages: [
      message(
        'm-1',
        'c-anna',
        'u-anna',
        'Anna Schmidt',
        'Can you review the contract today?',
        '2025-03-03T09:00:00Z',
      ),
      message('m-2', 'c-ops', 'u-omar', 'عمر الفاروق', 'Agenda attached for Monday.', '2025-03-03T10:00:00Z'),
      message(
        'm-3',
        'c-ops',
        'u-anna',
        'Anna Schmidt',
        'Thanks, the budget line looks fine.',
        '2025-03-03T11:00:00Z',
      ),
      message(
        'm-4',
        'c-lectorium',
        'u-yuki',
        '佐藤由紀',
        'Лекция в четверг —資料は明日送ります',
        '2025-03-04T08:30:00Z',
      ),
    ],
    files: [
      {
        file_id: 'f-agenda',
        message_id: 'm-2',
        conversation_id: 'c-ops',
        file_name: 'agenda.txt',
        mime_type: 'text/plain',
        created_at: '2025-03-03T10:00:00.000Z',
        content: '1. Budget\n2. Hiring\n3. Any other',
      },
    ],
  };
}

function message(
  message_id: string,
  conversation_id: string,
  sender_id: string,
  sender_name: string,
  content_text: string,
  at: string,
): Omit<Message, 'raw_ref' | 'attachments'> {
  const created_at = new Date(at).toISOString();
  return {
    message_id,
    conversation_id,
    sender_id,
    sender_name,
    content_type: 'text',
    content_text,
    created_at,
    received_at: created_at,
  };
}

/** An error the bridge answers with its kind (docs/bridge.md). */
export class BridgeFailure extends Error {
  constructor(
    readonly kind: BridgeErrorKind,
    message: string,
    readonly candidates?: { target_id: string; display_name: string | null }[],
  ) {
    super(message);
  }
}

export const sha256 = (bytes: Buffer) => createHash('sha256').update(bytes).digest('hex');

/** Matching as a messenger's search box does it: Unicode-normalised, case-insensitive. */
export const norm = (s: string | null | undefined) => (s ?? '').normalize('NFKC').toLowerCase();

/** Rank of a match of `q` in `name` (exact, prefix, anywhere) or in the other fields; undefined for none. */
export function rank(q: string, name: string, others: (string | null)[]): number | undefined {
  const n = norm(name);
  if (n === q) return 0;
  if (n.startsWith(q)) return 1;
  if (n.includes(q)) return 2;
  return others.some((o) => norm(o).includes(q)) ? 3 : undefined;
}

export const CONFIDENCE = [1, 0.9, 0.75, 0.5] as const;

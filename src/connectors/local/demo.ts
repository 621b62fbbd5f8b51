import type { ImportData } from './import.ts';

/** One entry of an ImportData list. */
type Entry<K extends keyof ImportData> = NonNullable<ImportData[K]>[number];

const b64 = (text: string) => Buffer.from(text, 'utf8').toString('base64');

function message(
  id: string,
  conversation_id: string,
  sender_id: string,
  sender_name: string,
  created_at: string,
  content_text: string,
  content_type: 'text' | 'file' | 'notify' = 'text',
): Entry<'messages'> {
  return {
    id,
    conversation_id,
    sender_id,
    sender_name,
    created_at,
    received_at: created_at,
    content_text,
    content_type,
  };
}

const CONTACTS: Entry<'contacts'>[] = [
  {
    id: 'ct_alice',
    display_name: 'Alice Martin',
    account: 'alice.martin',
    department: 'Legal',
    title: 'General Counsel',
  },
  {
    id: 'ct_elodie',
    display_name: 'Élodie Durand',
    account: 'elodie.durand',
    department: 'Finance',
    title: 'Controller',
  },
  {
    id: 'ct_marco',
    display_name: 'Marco Rossi',
    account: 'marco.rossi',
    department: 'Operations',
    title: 'Plant Manager',
  },
  {
    id: 'ct_david',
    display_name: 'דוד לוי',
    account: 'david.levi',
    department: 'כספים',
    title: 'יושב ראש הוועדה',
  },
  {
    id: 'ct_sarah',
    display_name: 'שרה כהן',
    account: 'sarah.cohen',
    department: 'משפטית',
    title: 'יועצת משפטית',
  },
  { id: 'ct_wang', display_name: '王伟', account: 'wang.wei', department: '研发部', title: '工程师' },
  { id: 'ct_lina', display_name: '李娜', account: 'li.na', department: '市场部', title: '经理' },
  { id: 'ct_zhang', display_name: '张敏', account: 'zhang.min', department: '研发部', title: '架构师' },
  {
    id: 'ct_martin_old',
    display_name: 'Martin Old',
    account: 'm.old',
    department: 'Legal',
    title: 'Paralegal',
    active: false,
  },
  {
    id: 'ct_chen_old',
    display_name: '陈静',
    account: 'chen.jing',
    department: '财务部',
    title: '会计',
    active: false,
  },
];

const GROUPS: Entry<'groups'>[] = [
  {
    id: 'gr_board',
    display_name: 'Board of Directors',
    owner_contact_id: 'ct_alice',
    members: ['ct_alice', 'ct_elodie', 'ct_david'],
  },
  {
    id: 'gr_finance',
    display_name: 'ועדת כספים',
    owner_contact_id: 'ct_david',
    members: ['ct_david', 'ct_sarah', 'ct_elodie'],
  },
  {
    id: 'gr_alpha',
    display_name: '项目组 Alpha',
    owner_contact_id: 'ct_wang',
    members: ['ct_wang', 'ct_lina', 'ct_zhang', 'ct_marco'],
  },
  {
    id: 'gr_offsite',
    display_name: 'Offsite 2019',
    owner_contact_id: 'ct_marco',
    archived: true,
    members: ['ct_marco', 'ct_alice'],
  },
];

const CONVERSATIONS: Entry<'conversations'>[] = [
  {
    id: 'cv_alice',
    conversation_type: 'direct',
    display_name: 'Alice Martin',
    contact_id: 'ct_alice',
  },
  { id: 'cv_david', conversation_type: 'direct', display_name: 'דוד לוי', contact_id: 'ct_david' },
  { id: 'cv_wang', conversation_type: 'direct', display_name: '王伟', contact_id: 'ct_wang' },
  {
    id: 'cv_board',
    conversation_type: 'group',
    display_name: 'Board of Directors',
    group_id: 'gr_board',
  },
  {
    id: 'cv_finance',
    conversation_type: 'group',
    display_name: 'ועדת כספים',
    group_id: 'gr_finance',
  },
  {
    id: 'cv_alpha',
    conversation_type: 'group',
    display_name: '项目组 Alpha',
    group_id: 'gr_alpha',
  },
  { id: 'cv_system', conversation_type: 'system', display_name: 'System notices' },
];

const MESSAGES: Entry<'messages'>[] = [
  message(
    'ms_001',
    'cv_alice',
    'ct_alice',
    'Alice Martin',
    '2026-11-23T09:00:00.000Z',
    'Can you draft the reply to the auditors?\nDeadline is Friday.',
  ),
  message(
    'ms_002',
    'cv_alice',
    'ct_alice',
    'Alice Martin',
    '2026-11-23T09:05:00.000Z',
    'The minutes are attached 📎',
    'file',
  ),
  message(
    'ms_003',
    'cv_david',
    'ct_david',
    'דוד לוי',
    '2026-11-24T07:30:00.000Z',
    'שלום, האם הדוח הרבעוני מוכן?\nנא לשלוח עד יום חמישי.',
  ),
  message('ms_004', 'cv_david', 'ct_david', 'דוד לוי', '2026-11-24T07:31:00.000Z', 'תודה רבה 🙏'),
  message(
    'ms_005',
    'cv_wang',
    'ct_wang',
    '王伟',
    '2026-11-25T02:10:00.000Z',
    '你好，预算表已经更新了，请查收。',
    'file',
  ),
  message(
    'ms_006',
    'cv_wang',
    'ct_wang',
    '王伟',
    '2026-11-25T02:12:00.000Z',
    '下周一开会讨论 Alpha 项目进度。',
  ),
  message(
    'ms_007',
    'cv_board',
    'ct_elodie',
    'Élodie Durand',
    '2026-11-26T10:00:00.000Z',
    'Q3 figures are final. Budget review on Monday.',
  ),
  message(
    'ms_008',
    'cv_board',
    'ct_david',
    'דוד לוי',
    '2026-11-26T10:04:00.000Z',
    'Agreed — budget review Monday 10:00.',
  ),
  message(
    'ms_009',
    'cv_finance',
    'ct_sarah',
    'שרה כהן',
    '2026-11-27T08:15:00.000Z',
    'הישיבה הבאה של ועדת הכספים ביום ראשון.',
  ),
  message('ms_010', 'cv_alpha', 'ct_lina', '李娜', '2026-11-27T03:00:00.000Z', '市场调研报告初稿完成 ✅'),
  message(
    'ms_011',
    'cv_alpha',
    'ct_zhang',
    '张敏',
    '2026-11-27T03:20:00.000Z',
    'Architecture review: see the attached notes.',
    'file',
  ),
  message(
    'ms_012',
    'cv_system',
    'system',
    'System',
    '2026-11-28T00:00:00.000Z',
    'Scheduled maintenance on Sunday 02:00 UTC.',
    'notify',
  ),
];

const FILES: Entry<'files'>[] = [
  {
    id: 'fl_minutes',
    message_id: 'ms_002',
    conversation_id: 'cv_alice',
    file_name: 'board-minutes.txt',
    mime_type: 'text/plain',
    created_at: '2026-11-23T09:05:00.000Z',
    content_base64: b64('Board minutes, 20 Nov 2026\n1. Budget approved.\n2. Audit reply due Friday.\n'),
  },
  {
    id: 'fl_budget',
    message_id: 'ms_005',
    conversation_id: 'cv_wang',
    file_name: '预算.csv',
    mime_type: 'text/csv',
    created_at: '2026-11-25T02:10:00.000Z',
    content_base64: b64('项目,金额\nAlpha,120000\nBeta,80000\n'),
  },
  {
    id: 'fl_arch',
    message_id: 'ms_011',
    conversation_id: 'cv_alpha',
    file_name: 'architecture-notes.md',
    mime_type: 'text/markdown',
    created_at: '2026-11-27T03:20:00.000Z',
    content_base64: b64('# Alpha architecture\n\n- one database\n- one audit chain\n'),
  },
];

/**
 * A small multilingual directory: Latin, Hebrew and Chinese names and texts, right-to-left content,
 * emoji and multi-line messages, some inactive contacts and an archived group.
 */
export function demoData(): ImportData {
  // A copy for each caller: the constants stay as they are, whatever a caller does with its data.
  return structuredClone({
    // Every demo contact is inside the organisation but David Levi, who chairs the committee from outside.
    contacts: CONTACTS.map((c) => ({ ...c, external: c.id === 'ct_david' })),
    groups: GROUPS,
    conversations: CONVERSATIONS,
    messages: MESSAGES,
    files: FILES,
  });
}

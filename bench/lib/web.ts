/** What a chair's browser does, without a browser: keeps cookies, fills hidden fields, posts forms. */
export class ChairSession {
  private readonly cookies = new Map<string, string>();
  private csrf = '';
  /** Sessions live in the database: any server on it accepts them. */
  constructor(public base: string) {}

  private async request(method: 'GET' | 'POST', path: string, form?: Record<string, string>) {
    const res = await fetch(new URL(path, this.base), {
      method,
      redirect: 'manual',
      headers: {
        ...(form ? { 'content-type': 'application/x-www-form-urlencoded' } : {}),
        cookie: [...this.cookies].map(([k, v]) => `${k}=${v}`).join('; '),
      },
      body: form ? new URLSearchParams(form).toString() : undefined,
    });
    for (const line of res.headers.getSetCookie()) {
      const pair = line.split(';')[0]!;
      const eq = pair.indexOf('=');
      this.cookies.set(pair.slice(0, eq), pair.slice(eq + 1));
    }
    return { status: res.status, html: await res.text() };
  }

  private static field(html: string, name: string): string {
    const m = new RegExp(`name="${name}" value="([^"]*)"`).exec(html);
    if (!m) throw new Error(`no ${name} field in the page`);
    return m[1]!;
  }

  /** Signs in and keeps the session's form token. */
  async login(name: string, password: string): Promise<void> {
    const page = await this.request('GET', '/login');
    const done = await this.request('POST', '/login', {
      _csrf: ChairSession.field(page.html, '_csrf'),
      next: '/approvals',
      name,
      password,
    });
    if (done.status !== 303) throw new Error(`sign-in failed with ${done.status}`);
    this.csrf = ChairSession.field((await this.request('GET', '/approvals')).html, '_csrf');
  }

  /**
   * Approves a request through the review form. Resolves with the HTTP status: 303 (the redirect that
   * follows a recorded decision), or the status of the page explaining why not (409: no longer pending).
   */
  async decide(requestId: string): Promise<number> {
    const res = await this.request('POST', `/approvals/${requestId}/decision`, {
      _csrf: this.csrf,
      decision: 'approve',
      note: '',
    });
    return res.status;
  }

  async approve(requestId: string): Promise<void> {
    const status = await this.decide(requestId);
    if (status !== 303) throw new Error(`approval of ${requestId} answered ${status}`);
  }
}

/** A tiny cookie-keeping HTTP client for the web pages (what a browser without JavaScript does). */
export class WebClient {
  readonly cookies = new Map<string, string>();
  constructor(readonly base: string) {}

  async request(
    method: 'GET' | 'POST',
    path: string,
    form?: Record<string, string>,
    headers: Record<string, string> = {},
  ) {
    const res = await fetch(new URL(path, this.base), {
      method,
      redirect: 'manual',
      headers: {
        ...(form ? { 'content-type': 'application/x-www-form-urlencoded' } : {}),
        cookie: [...this.cookies].map(([k, v]) => `${k}=${v}`).join('; '),
        ...headers,
      },
      body: form ? new URLSearchParams(form).toString() : undefined,
    });
    for (const line of res.headers.getSetCookie()) {
      const [pair] = line.split(';');
      const eq = pair!.indexOf('=');
      const name = pair!.slice(0, eq);
      const value = pair!.slice(eq + 1);
      if (value === '' || /expires=Thu, 01 Jan 1970/i.test(line)) this.cookies.delete(name);
      else this.cookies.set(name, value);
    }
    return { res, html: await res.text(), setCookies: res.headers.getSetCookie() };
  }

  get = (path: string, headers?: Record<string, string>) => this.request('GET', path, undefined, headers);
  post = (path: string, form: Record<string, string>, headers?: Record<string, string>) =>
    this.request('POST', path, form, headers);

  /** The value of a hidden input in a page. */
  static field(html: string, name: string): string {
    const m = new RegExp(`name="${name}" value="([^"]*)"`).exec(html);
    if (!m) throw new Error(`no ${name} field`);
    return m[1]!;
  }

  async login(name: string, password: string) {
    const page = await this.get('/login');
    return this.post('/login', {
      _csrf: WebClient.field(page.html, '_csrf'),
      next: '/approvals',
      name,
      password,
    });
  }
}

/**
 * What the daemon behind the server has, asked once at start: its version
 * and the images in its store.  The server's instructions and the tools'
 * descriptions say these, not fixed text.
 */
import { withConnection, type ConnectionOpts } from '../connection';

export interface DaemonFacts {
  /** The daemon's version, when it said. */
  version?: string;
  /** The refs of the images in its store (the embedded `default` is always there and not among them). */
  images: string[];
}

/** What the daemon says of itself; what it does not answer stays unknown (the server still serves). */
export async function daemonFacts(conn: ConnectionOpts): Promise<DaemonFacts> {
  try {
    return await withConnection(conn, async (c) => {
      const hello = await c.call<{ version?: string }>('hello', { protocol: 1 }).catch(() => ({}) as { version?: string });
      const list = await c.call<{ images?: Array<{ ref?: string }> }>('image.list', {}).catch(() => ({ images: [] }));
      const images = (list.images ?? []).map((i) => i.ref).filter((r): r is string => typeof r === 'string');
      const f: DaemonFacts = { images: images.slice(0, 50) };
      if (typeof hello.version === 'string') f.version = hello.version;
      return f;
    });
  } catch {
    return { images: [] };
  }
}

/** The images a description names: the default one, then the store's. */
export function imagesText(f: DaemonFacts): string {
  const store = f.images.length ? `; in this daemon's store: ${f.images.map((i) => JSON.stringify(i)).join(', ')}` : '; no other image in its store yet';
  return `"default" (the embedded busybox image; commands run as the unprivileged \`user\`, uid 1000, in /home/user)${store}`;
}

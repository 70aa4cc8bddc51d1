/**
 * E2B's network options (`allowInternetAccess`, `network: { allowOut,
 * denyOut }`, `updateNetwork`) mapped onto tupper's rules (docs/network.md).
 *
 * E2B allows every destination unless `denyOut` says otherwise, and its
 * `allowOut` entries are exceptions to `denyOut`; tupper allows nothing
 * unless a rule says so, and deny wins.  So:
 *  - `allowOut` lists become allow rules (`ALL_TRAFFIC` in it: `"all"`);
 *  - `denyOut` entries other than `ALL_TRAFFIC`, and not also in `allowOut`,
 *    become deny rules;
 *  - `denyOut` without `ALL_TRAFFIC` and without `allowOut` ("everything but
 *    these") is refused: tupper has no "all but" form yet;
 *  - neither list: tupper's default, no network (not E2B's "everything").
 */
import { InvalidArgumentError } from './errors';
import type { NetworkRules } from './sandbox-opts';

/** E2B's name for every IPv4 destination: in `denyOut`, "deny all but `allowOut`". */
export const ALL_TRAFFIC = '0.0.0.0/0';

/** What an E2B selector callback is given. */
export interface SandboxNetworkSelectorContext {
  allTraffic: string;
  rules: Map<string, unknown[]>;
}

/** A list of CIDRs, IPs and domain names (`*.` wildcards), or a callback returning one (E2B). */
export type SandboxNetworkSelector = string[] | ((ctx: SandboxNetworkSelectorContext) => string[]);

/** E2B's `network` option: what tupper takes of it (see the module comment). */
export interface SandboxNetworkOpts {
  allowOut?: SandboxNetworkSelector;
  denyOut?: SandboxNetworkSelector;
  /** Accepted (E2B): sandbox ports are reached through the host's loopback (getHost) either way. */
  allowPublicTraffic?: boolean;
}

/** E2B's updateNetwork argument: the rules are replaced as a whole. */
export type SandboxNetworkUpdate = Pick<SandboxNetworkOpts, 'allowOut' | 'denyOut'>;

const E2B_KEYS = new Set(['allowOut', 'denyOut', 'allowPublicTraffic']);
const TUPPER_KEYS = new Set(['allow', 'deny']);

function selector(v: unknown, what: string): string[] | undefined {
  if (v === undefined) return undefined;
  const list = typeof v === 'function' ? (v as (c: SandboxNetworkSelectorContext) => unknown)({ allTraffic: ALL_TRAFFIC, rules: new Map() }) : v;
  if (!Array.isArray(list) || !list.every((x) => typeof x === 'string')) {
    throw new InvalidArgumentError(`${what} must be a list of CIDRs, IPs or domain names`);
  }
  return list as string[];
}

/** True for E2B's shape of `network` (allowOut / denyOut), false for tupper's ("none", "all", {allow, deny}). */
export function isE2BNetwork(v: unknown): v is SandboxNetworkOpts {
  if (v === null || typeof v !== 'object' || Array.isArray(v)) return false;
  const keys = Object.keys(v);
  return keys.length > 0 && keys.every((k) => E2B_KEYS.has(k));
}

/** E2B's allowOut / denyOut as tupper's rules (see the module comment), `what` naming the call in errors. */
export function fromE2BNetwork(n: SandboxNetworkOpts, what: string): NetworkRules {
  const allow = selector(n.allowOut, `${what}: network.allowOut`);
  const deny = selector(n.denyOut, `${what}: network.denyOut`);
  if (n.allowPublicTraffic !== undefined && typeof n.allowPublicTraffic !== 'boolean') {
    throw new InvalidArgumentError(`${what}: network.allowPublicTraffic must be a boolean`);
  }
  if (allow === undefined && deny === undefined) return 'none';
  const allowSet = new Set(allow ?? []);
  const denyAll = deny?.includes(ALL_TRAFFIC) ?? false;
  const denyRest = (deny ?? []).filter((d) => d !== ALL_TRAFFIC && !allowSet.has(d));
  if (allowSet.has(ALL_TRAFFIC)) {
    if (denyRest.length > 0) {
      throw new InvalidArgumentError(
        `${what}: tupper cannot allow all traffic but some destinations; name what the box may reach in network.allowOut`,
      );
    }
    return 'all';
  }
  if (!denyAll && (allow === undefined || allow.length === 0)) {
    if (denyRest.length === 0) return 'none';
    throw new InvalidArgumentError(
      `${what}: tupper allows no network by default and cannot allow all but network.denyOut; ` +
        'name what the box may reach in network.allowOut (with denyOut: [ALL_TRAFFIC])',
    );
  }
  return { allow: [...allowSet], deny: denyRest };
}

/**
 * The network param of a create from its `network` and
 * `allowInternetAccess` (E2B's or tupper's shapes); undefined leaves the
 * daemon's default, no network.
 */
export function networkParam(network: unknown, allowInternetAccess: unknown, what: string): NetworkRules | undefined {
  if (allowInternetAccess !== undefined && typeof allowInternetAccess !== 'boolean') {
    throw new InvalidArgumentError(`${what}: allowInternetAccess must be a boolean`);
  }
  let rules: NetworkRules | undefined;
  if (network !== undefined) rules = checkNetwork(network, what);
  if (allowInternetAccess === false) {
    // E2B: the same as denyOut [ALL_TRAFFIC]: what allowOut names stays reachable
    return rules ?? 'none';
  }
  if (allowInternetAccess === true && (rules === undefined || rules === 'none')) return 'all';
  return rules;
}

/** network in either shape as tupper's rules; anything else an InvalidArgumentError. */
export function checkNetwork(network: unknown, what: string): NetworkRules {
  if (network === 'none' || network === 'all') return network;
  if (isE2BNetwork(network)) return fromE2BNetwork(network, what);
  if (network !== null && typeof network === 'object' && !Array.isArray(network)) {
    const keys = Object.keys(network);
    if (keys.every((k) => TUPPER_KEYS.has(k))) return network as NetworkRules;
    const bad = keys.filter((k) => !TUPPER_KEYS.has(k) && !E2B_KEYS.has(k));
    if (bad.length === 0) {
      throw new InvalidArgumentError(`${what}: network mixes E2B's allowOut, denyOut with tupper's allow, deny: use one or the other`);
    }
    throw new InvalidArgumentError(
      `${what}: unknown network option${bad.length > 1 ? 's' : ''} ${bad.map((k) => `'${k}'`).join(', ')} ` +
        '(expected allowOut, denyOut, allowPublicTraffic, or tupper\'s allow, deny)',
    );
  }
  throw new InvalidArgumentError(`${what}: network must be "none", "all", { allowOut, denyOut } or { allow, deny }`);
}

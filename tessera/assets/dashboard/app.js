// The tessera dashboard: the cluster's members, live from GET /cluster/events; per entity type
// each node's shards and live entities (GET /sharding/{type}/cluster) and this node's
// Distributed Data key count (GET /dashboard/node), refreshed every 2 s and on membership
// events.
//
// The event stream is read with fetch rather than EventSource, which cannot send a header:
// a node that requires a bearer token for reads answers 401, the page then asks for the
// token and sends it as `Authorization: Bearer` on every request. One reader serves both
// cases, reconnecting with backoff, and starting over from the `current-state` the node sends
// first on every connection.
'use strict';

const REFRESH_MS = 2000;
const REFRESH_DEBOUNCE_MS = 250;
// The node sends a keep-alive every 10 s: a stream silent for this long is dead.
const STALL_MS = 30000;
const RETRY_MS_MIN = 500;
const RETRY_MS_MAX = 5000;
// Removed members stay listed this long, greyed, so that the removal can be seen.
const REMOVED_ROW_MS = 30000;
const EVENTS_SHOWN_MAX = 12;
// A frame larger than this is not from a tessera node; the stream is dropped.
const FRAME_BYTES_MAX = 1 << 20;
// The up number of a member that was never Up.
const NO_UP_NUMBER = 2147483647;
const TOKEN_KEY = 'tessera.http_token';

const view = {
  self: null,
  leader: null,
  // "address#uid" -> {address, uid, status, roles, up_number, reachable, removedAt}
  members: new Map(),
  events: [],
};

let token = sessionStorage.getItem(TOKEN_KEY);
let tokenEntered = null;

const $ = (id) => document.getElementById(id);

class Unauthorized extends Error {}

// --- HTTP ---------------------------------------------------------------------------------

async function api(path, init = {}) {
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  const response = await fetch(path, { ...init, headers, cache: 'no-store' });
  if (response.status === 401) {
    const body = await response.json().catch(() => ({}));
    throw new Unauthorized(body.error || 'unauthorized');
  }
  return response;
}

async function getJson(path) {
  const response = await api(path);
  const body = await response.json().catch(() => null);
  if (!response.ok) {
    throw new Error((body && body.error) || `${path}: HTTP ${response.status}`);
  }
  return body;
}

// Shows the token field; resolves once a token was entered.
function askForToken(message) {
  $('token-form').hidden = false;
  $('token-error').textContent = token ? message : '';
  if (!tokenEntered) {
    tokenEntered = new Promise((resolve) => {
      $('token-form').onsubmit = (event) => {
        event.preventDefault();
        token = $('token').value.trim();
        sessionStorage.setItem(TOKEN_KEY, token);
        $('token-form').hidden = true;
        tokenEntered = null;
        resolve();
        refreshSoon();
      };
    });
  }
  return tokenEntered;
}

// --- the event stream -----------------------------------------------------------------------

async function follow() {
  let retryMs = RETRY_MS_MIN;
  for (;;) {
    const abort = new AbortController();
    let stall = null;
    const resetStall = () => {
      clearTimeout(stall);
      stall = setTimeout(() => abort.abort(), STALL_MS);
    };
    try {
      resetStall();
      const response = await api('/cluster/events', { signal: abort.signal });
      if (!response.ok) {
        const body = await response.json().catch(() => ({}));
        throw new Error(body.error || `HTTP ${response.status}`);
      }
      setConnection('live', 'on');
      retryMs = RETRY_MS_MIN;
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        resetStall();
        // tessera sends LF line ends; CRs are dropped in case a proxy added them.
        buffer += value.replace(/\r/g, '');
        let end;
        while ((end = buffer.indexOf('\n\n')) >= 0) {
          dispatch(buffer.slice(0, end));
          buffer = buffer.slice(end + 2);
        }
        if (buffer.length > FRAME_BYTES_MAX) throw new Error('oversized event');
      }
      setConnection('reconnecting: the stream ended', 'off');
    } catch (error) {
      if (error instanceof Unauthorized) {
        setConnection('token needed', 'off');
        await askForToken(error.message);
        continue;
      }
      const why = abort.signal.aborted ? 'no data for 30 s' : error.message;
      setConnection(`reconnecting: ${why}`, 'off');
    } finally {
      clearTimeout(stall);
    }
    await new Promise((resolve) => setTimeout(resolve, retryMs));
    retryMs = Math.min(retryMs * 2, RETRY_MS_MAX);
  }
}

// One server-sent event: `event:` and `data:` lines; comments (keep-alives) have none.
function dispatch(frame) {
  let name = 'message';
  const data = [];
  for (const line of frame.split('\n')) {
    if (line === '' || line.startsWith(':')) continue;
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'event') name = value;
    else if (field === 'data') data.push(value);
  }
  if (data.length > 0) apply(name, JSON.parse(data.join('\n')));
}

const key = (member) => `${member.address}#${member.uid}`;

function apply(name, data) {
  if (name === 'current-state') {
    const unreachable = new Set(data.unreachable.map(key));
    view.self = data.self;
    view.leader = data.leader;
    view.members.clear();
    for (const member of data.members) {
      view.members.set(key(member), { ...member, reachable: !unreachable.has(key(member)) });
    }
    note(name, `${data.members.length} members`);
  } else if (name === 'leader-changed') {
    view.leader = data.leader;
    note(name, data.leader || 'none');
  } else if (data.member) {
    const known = view.members.get(key(data.member));
    const member = {
      ...data.member,
      reachable: known ? known.reachable : true,
      removedAt: known ? known.removedAt : undefined,
    };
    if (name === 'unreachable-member') member.reachable = false;
    if (name === 'reachable-member') member.reachable = true;
    if (name === 'member-removed') member.removedAt = Date.now();
    view.members.set(key(member), member);
    note(name, data.member.address);
  } else {
    return;
  }
  renderMembers();
  if (name !== 'leader-changed') refreshSoon();
}

// --- rendering ------------------------------------------------------------------------------

function el(tag, props = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (name === 'class') element.className = value;
    else if (name.startsWith('data-')) element.setAttribute(name, value);
    else element[name] = value;
  }
  element.append(...children);
  return element;
}

const clock = (date) => date.toTimeString().slice(0, 8);

function setConnection(text, state) {
  const badge = $('connection');
  badge.textContent = text;
  badge.className = `badge ${state}`;
}

function note(name, detail) {
  view.events.unshift({ at: new Date(), name, detail });
  view.events.length = Math.min(view.events.length, EVENTS_SHOWN_MAX);
  $('events').replaceChildren(
    ...view.events.map((event) =>
      el(
        'li',
        {},
        el('time', {}, clock(event.at)),
        el('span', { class: 'event-name' }, event.name),
        el('span', {}, event.detail),
      ),
    ),
  );
}

function shownMembers() {
  const now = Date.now();
  return [...view.members.values()]
    .filter((m) => !(m.removedAt && now - m.removedAt > REMOVED_ROW_MS))
    .sort((a, b) => a.address.localeCompare(b.address, 'en', { numeric: true }) || a.uid - b.uid);
}

function renderMembers() {
  const members = shownMembers();
  const rows = members.map((m) => {
    const leader = m.address === view.leader && m.status !== 'removed';
    const address = el('td', { class: 'address' }, m.address);
    if (m.address === view.self) address.append(el('span', { class: 'tag' }, 'this node'));
    return el(
      'tr',
      {
        class: `member status-${m.status}${m.reachable ? '' : ' is-unreachable'}`,
        'data-address': m.address,
        'data-uid': String(m.uid),
      },
      address,
      el('td', { class: 'status' }, el('span', { class: `pill status-${m.status}` }, m.status)),
      el('td', { class: `reachability ${m.reachable ? '' : 'bad'}` }, m.reachable ? 'reachable' : 'unreachable'),
      el('td', { class: 'leader' }, leader ? 'leader' : ''),
      el('td', { class: 'roles' }, m.roles.length ? m.roles.join(', ') : '—'),
      el('td', { class: 'num' }, m.up_number === NO_UP_NUMBER ? '—' : String(m.up_number)),
    );
  });
  if (rows.length === 0) {
    rows.push(el('tr', {}, el('td', { colSpan: 6, class: 'muted' }, 'waiting for the cluster…')));
  }
  $('members').tBodies[0].replaceChildren(...rows);

  const live = members.filter((m) => m.status !== 'removed');
  $('count-up').textContent = `${live.filter((m) => m.status === 'up').length} / ${live.length}`;
  const unreachable = live.filter((m) => !m.reachable).length;
  $('count-unreachable').textContent = String(unreachable);
  $('count-unreachable').className = `value${unreachable > 0 ? ' bad' : ''}`;
  $('leader').textContent = view.leader || 'none';
  $('self').textContent = view.self ? `node ${view.self}` : '';
}

function renderSharding(types) {
  const blocks = types.map(({ type, cluster, error }) => {
    const title = el('h3', {}, type);
    if (error) return el('div', { class: 'entity-type' }, title, el('p', { class: 'error' }, error));
    let shards = 0;
    let entities = 0;
    const rows = cluster.regions
      .slice()
      .sort((a, b) => a.address.localeCompare(b.address, 'en', { numeric: true }))
      .map((region) => {
        const live = region.shards.reduce((sum, shard) => sum + shard.entities, 0);
        shards += region.shards.length;
        entities += live;
        return el(
          'tr',
          { 'data-address': region.address },
          el('td', { class: 'address' }, region.address),
          el('td', { class: 'num' }, String(region.shards.length)),
          el('td', { class: 'num' }, String(live)),
        );
      });
    for (const failed of cluster.failed) {
      rows.push(
        el(
          'tr',
          { class: 'failed', 'data-address': failed.address },
          el('td', { class: 'address' }, failed.address),
          el('td', { colSpan: 2, class: 'bad' }, `no answer: ${failed.error}`),
        ),
      );
    }
    const table = el(
      'table',
      { class: 'shards' },
      el('thead', {}, el('tr', {}, el('th', {}, 'node'), el('th', { class: 'num' }, 'shards'), el('th', { class: 'num' }, 'live entities'))),
      el('tbody', {}, ...rows),
      el('tfoot', {}, el('tr', {}, el('td', {}, 'total'), el('td', { class: 'num' }, String(shards)), el('td', { class: 'num' }, String(entities)))),
    );
    return el('div', { class: 'entity-type', 'data-type': type }, title, table);
  });
  $('entity-types').replaceChildren(...blocks);
}

const orDash = (value) => (value === null || value === undefined ? '—' : String(value));

// One table per projection: each instance with the node it runs on, its state, what it
// handled and failed, and its lag (GET /projections).
function renderProjections(listing) {
  const blocks = listing.projections.map((projection) => {
    const paused = projection.paused ? el('span', { class: 'pill status-leaving' }, 'paused') : '';
    const lag = projection.lag_seconds === null ? '—' : `${projection.lag_seconds.toFixed(1)} s`;
    const title = el(
      'h3',
      {},
      `${projection.name} `,
      el('span', { class: 'muted small' }, `${projection.entity_type}, ${projection.instances} instances, lag ${orDash(projection.lag_events)} events / ${lag} `),
      paused,
    );
    const rows = projection.instance_status.map((instance) =>
      el(
        'tr',
        { 'data-index': String(instance.index) },
        el('td', { class: 'num' }, String(instance.index)),
        el('td', { class: 'address' }, orDash(instance.node)),
        el('td', {}, instance.state),
        el('td', { class: 'num' }, orDash(instance.handled)),
        el('td', { class: `num${instance.handler_errors > 0 ? ' bad' : ''}` }, orDash(instance.handler_errors)),
        el('td', { class: 'num' }, orDash(instance.lag_events)),
        el('td', { class: 'num' }, instance.lag_seconds === null || instance.lag_seconds === undefined ? '—' : instance.lag_seconds.toFixed(1)),
      ),
    );
    const table = el(
      'table',
      { class: 'instances' },
      el(
        'thead',
        {},
        el(
          'tr',
          {},
          el('th', { class: 'num' }, 'instance'),
          el('th', {}, 'node'),
          el('th', {}, 'state'),
          el('th', { class: 'num' }, 'handled'),
          el('th', { class: 'num' }, 'handler errors'),
          el('th', { class: 'num' }, 'lag (events)'),
          el('th', { class: 'num' }, 'lag (s)'),
        ),
      ),
      el('tbody', {}, ...rows),
    );
    return el('div', { class: 'projection', 'data-projection': projection.name }, title, table);
  });
  for (const failed of listing.failed) {
    blocks.push(el('p', { class: 'bad' }, `${failed.address}: no answer: ${failed.error}`));
  }
  if (blocks.length === 0) blocks.push(el('p', { class: 'muted' }, 'none registered'));
  $('projection-list').replaceChildren(...blocks);
}

// --- periodic reads -------------------------------------------------------------------------

let refreshing = false;
let refreshQueued = false;
let refreshTimer = null;

// A refresh soon, once for a burst of events.
function refreshSoon() {
  clearTimeout(refreshTimer);
  refreshTimer = setTimeout(refresh, REFRESH_DEBOUNCE_MS);
}

// Reads the node summary and each type's shards; one at a time (a dead member makes
// /sharding/{type}/cluster wait for its timeout), with at most one more queued.
async function refresh() {
  if (refreshing) {
    refreshQueued = true;
    return;
  }
  refreshing = true;
  try {
    const node = await getJson('/dashboard/node');
    $('ddata-keys').textContent = String(node.ddata_keys);
    if (!view.self) $('self').textContent = `node ${node.self}`;
    const types = [];
    for (const type of node.entity_types) {
      try {
        types.push({ type, cluster: await getJson(`/sharding/${encodeURIComponent(type)}/cluster`) });
      } catch (error) {
        if (error instanceof Unauthorized) throw error;
        types.push({ type, error: error.message });
      }
    }
    renderSharding(types);
    $('sharding-updated').textContent = `updated ${clock(new Date())}`;
    renderProjections(await getJson('/projections'));
  } catch (error) {
    if (error instanceof Unauthorized) askForToken(error.message);
    else $('sharding-updated').textContent = `not updated: ${error.message}`;
  } finally {
    refreshing = false;
    if (refreshQueued) {
      refreshQueued = false;
      refreshSoon();
    }
  }
}

renderMembers();
follow();
refresh();
setInterval(() => {
  refresh();
  // Lets removed members age out of the table.
  renderMembers();
}, REFRESH_MS);

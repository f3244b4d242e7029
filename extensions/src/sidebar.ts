/**
 * The Together sidebar: the attached cluster, desired against allocated preemptible GPUs, a scale
 * control in steps of 8 (with a confirmation), the runs with status and progress, and the events.
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { ICluster, IEvent, ILeftover, IRun, ISweep } from './api';
import { sweepLine } from './sweepview';

export const GPUS_PER_NODE = 8;
const MAX_EVENTS = 200;

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className: string,
  text = ''
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  node.className = className;
  if (text) {
    node.textContent = text;
  }
  return node;
}

function bar(fraction: number, className: string): HTMLElement {
  const outer = el('div', `tgnb-bar ${className}`);
  const inner = el('div', 'tgnb-bar-fill');
  inner.style.width = `${Math.round(Math.max(0, Math.min(1, fraction)) * 100)}%`;
  outer.appendChild(inner);
  return outer;
}

/** Ask before changing the preemptible target; true when the user confirmed. */
export async function confirmScale(cluster: ICluster, target: number): Promise<boolean> {
  const result = await showDialog({
    title: 'Scale preemptible GPUs',
    body:
      `Set the preemptible target of ${cluster.name} from ` +
      `${cluster.desired_preemptible_gpus} to ${target} GPUs ` +
      `(${target / GPUS_PER_NODE} nodes)? Preemptible nodes can be reclaimed at any time.`,
    buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Scale' })]
  });
  return result.button.accept;
}

/** Runs to list: the unfinished ones first, then newest first (by creation, else by name). */
export function orderRuns(runs: IRun[]): IRun[] {
  const created = (r: IRun): number => r.created_at ?? 0;
  return [...runs].sort(
    (a, b) =>
      Number(a.finished) - Number(b.finished) ||
      created(b) - created(a) ||
      b.name.localeCompare(a.name)
  );
}

/** Whether `run` matches the filter's words (each in its name, state or nodes). */
export function runMatches(run: IRun, filter: string): boolean {
  const text = [run.name, run.state, ...run.nodes].join(' ').toLowerCase();
  return filter
    .toLowerCase()
    .split(/\s+/)
    .filter(Boolean)
    .every(word => text.includes(word));
}

export interface ISidebarActions {
  shown(): void;
  scale(target: number): Promise<void>;
  openTimeline(run: string): void;
  /** Open the run's live log (each attempt headed, followed until the run ends). */
  openLogs(run: string): void;
  /** Open a sweep's table and chart; stop every unfinished run of it (after a confirmation). */
  openSweep(sweep: string): void;
  stopSweep(sweep: string): Promise<void>;
  attach(): void;
}

export class TogetherSidebar extends Widget {
  constructor(private actions: ISidebarActions) {
    super();
    this.id = 'tgnb-sidebar';
    this.addClass('tgnb-Sidebar');
    this.title.caption = 'Together GPUs';
    const root = this.node;
    root.appendChild(el('h2', 'tgnb-title', 'Together'));
    this.clusterNode = el('div', 'tgnb-cluster');
    this.clusterNode.dataset.testid = 'tgnb-cluster';
    this.capacityNode = el('div', 'tgnb-capacity');
    this.capacityNode.dataset.testid = 'tgnb-capacity';
    root.append(this.clusterNode, this.capacityNode, this.scaleControl());
    this.errorNode = el('div', 'tgnb-error');
    this.errorNode.dataset.testid = 'tgnb-error';
    root.appendChild(this.errorNode);
    root.appendChild(el('h3', 'tgnb-heading', 'Runs'));
    this.filterNode = el('input', 'jp-mod-styled tgnb-runs-filter');
    this.filterNode.type = 'search';
    this.filterNode.placeholder = 'filter runs';
    this.filterNode.title = 'words of the name, state or node of the runs to show';
    this.filterNode.dataset.testid = 'tgnb-runs-filter';
    this.filterNode.oninput = () => this.renderRuns();
    root.appendChild(this.filterNode);
    this.runsNode = el('ul', 'tgnb-runs');
    this.runsNode.dataset.testid = 'tgnb-runs';
    root.appendChild(this.runsNode);
    root.appendChild(el('h3', 'tgnb-heading', 'Sweeps'));
    this.sweepsNode = el('ul', 'tgnb-sweeps');
    this.sweepsNode.dataset.testid = 'tgnb-sweeps';
    root.appendChild(this.sweepsNode);
    this.leftoversNode = el('div', 'tgnb-leftovers');
    this.leftoversNode.dataset.testid = 'tgnb-leftovers';
    root.appendChild(this.leftoversNode);
    root.appendChild(el('h3', 'tgnb-heading', 'Events'));
    this.eventsNode = el('ul', 'tgnb-events');
    this.eventsNode.dataset.testid = 'tgnb-events';
    root.appendChild(this.eventsNode);
    this.renderCluster();
    this.renderRuns();
    this.setSweeps([]);
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this.actions.shown();
  }

  get cluster(): ICluster | null {
    return this._cluster;
  }

  get runs(): IRun[] {
    return this._runs;
  }

  private scaleControl(): HTMLElement {
    const box = el('div', 'tgnb-scale');
    const minus = el('button', 'jp-Button tgnb-step', '−8');
    minus.title = 'one node less';
    minus.dataset.testid = 'tgnb-scale-down';
    const value = el('span', 'tgnb-scale-value', '0');
    value.dataset.testid = 'tgnb-scale-value';
    const plus = el('button', 'jp-Button tgnb-step', '+8');
    plus.title = 'one node more';
    plus.dataset.testid = 'tgnb-scale-up';
    const apply = el('button', 'jp-Button jp-mod-accept tgnb-apply', 'Scale');
    apply.dataset.testid = 'tgnb-scale-apply';
    minus.onclick = () => this.setPending(this.pending - GPUS_PER_NODE);
    plus.onclick = () => this.setPending(this.pending + GPUS_PER_NODE);
    apply.onclick = async () => {
      if (this._cluster && this.pending !== this._cluster.desired_preemptible_gpus) {
        await this.actions.scale(this.pending);
      }
    };
    box.append(el('span', 'tgnb-label', 'target'), minus, value, plus, el('span', '', 'GPUs'), apply);
    this.pendingNode = value;
    this.scaleButtons = [minus, plus, apply];
    for (const button of this.scaleButtons) {
      button.dataset.title = button.title;
    }
    return box;
  }

  /** The scale control works on an attached cluster only. */
  private enableScale(on: boolean): void {
    for (const button of this.scaleButtons) {
      button.disabled = !on;
      button.title = on ? (button.dataset.title ?? '') : 'attach to a cluster first';
    }
  }

  private setPending(target: number): void {
    this.pending = Math.max(0, target);
    this.pendingNode.textContent = String(this.pending);
  }

  setError(message: string): void {
    this.errorNode.textContent = message;
  }

  /** No cluster could be read (`reason`: why, with the fix): the normal state before anything
   * is attached, or after the platform stopped answering. Shown beside the Attach button, in the
   * muted colour of a state, not as an error; it replaces the reason shown before (one cause,
   * one message). */
  setUnattached(reason: string): void {
    this.errorNode.textContent = '';
    if (this._cluster !== null || (this.detachedReason || this.unattachedReason) === reason) {
      return;
    }
    if (this.detachedReason) {
      this.detachedReason = reason; // still disconnected: the newest word on why
    } else {
      this.unattachedReason = reason;
    }
    this.renderCluster();
  }

  /** The platform stopped answering (the emulator stopped or moved): no cluster until the next
   * read attaches again; `reason` says why, beside the Attach button. */
  setDetached(reason: string): void {
    this._cluster = null;
    this.detachedReason = reason;
    this.renderCluster();
  }

  setCluster(cluster: ICluster): void {
    this.detachedReason = '';
    const first = this._cluster === null || this._cluster.id !== cluster.id;
    const targetMoved =
      this._cluster !== null &&
      this._cluster.desired_preemptible_gpus !== cluster.desired_preemptible_gpus;
    if (this._cluster !== null && this._cluster.id !== cluster.id) {
      this.eventsNode.replaceChildren(); // another cluster: its own history follows
    }
    this._cluster = cluster;
    if (first || targetMoved) {
      this.setPending(cluster.desired_preemptible_gpus);
    }
    this.renderCluster();
  }

  setRuns(runs: IRun[]): void {
    this._runs = runs;
    this.renderRuns();
  }

  /** The sweeps of the cluster, newest first: each in a line (its runs by state, dollars, best
   * run) with buttons to open its table and chart, and to stop every run of it. */
  setSweeps(sweeps: ISweep[]): void {
    this._sweeps = sweeps;
    this.sweepsNode.replaceChildren();
    if (sweeps.length === 0) {
      const none = 'no sweeps yet: session.map(fn, items) or session.sweep(name, runs)';
      this.sweepsNode.appendChild(el('li', 'tgnb-muted', none));
      return;
    }
    for (const sweep of [...sweeps].sort((a, b) => b.created_at - a.created_at)) {
      const item = el('li', `tgnb-sweep${sweep.finished ? ' tgnb-sweep-finished' : ''}`);
      item.dataset.sweep = sweep.name;
      const head = el('div', 'tgnb-run-head');
      const state = sweep.finished ? 'finished' : 'running';
      head.append(el('span', 'tgnb-run-name', sweep.name), el('span', 'tgnb-badge', state));
      const open = el('button', 'jp-Button tgnb-link', 'open');
      open.title = 'its table and the chart of its runs, with their preemptions';
      open.dataset.testid = 'tgnb-sweep-open';
      open.onclick = () => this.actions.openSweep(sweep.name);
      const stop = el('button', 'jp-Button tgnb-link', 'stop');
      stop.title = sweep.finished ? 'every run has ended' : 'stop every unfinished run';
      stop.dataset.testid = 'tgnb-sweep-stop';
      stop.disabled = sweep.finished;
      stop.onclick = () => void this.actions.stopSweep(sweep.name);
      head.append(open, stop);
      item.append(head, el('div', 'tgnb-muted', sweepLine(sweep)));
      this.sweepsNode.appendChild(item);
    }
  }

  get sweeps(): ISweep[] {
    return this._sweeps;
  }

  /** Post-Training resources left billing by processes that are gone, with what they cost and
   * the command that stops them; nothing shown when there are none. */
  setLeftovers(leftovers: ILeftover[], stop: string): void {
    this.leftoversNode.replaceChildren();
    if (leftovers.length === 0) {
      return;
    }
    const head = `Left running: ${leftovers.length} Post-Training resource(s)`;
    this.leftoversNode.appendChild(el('h3', 'tgnb-heading tgnb-warning', head));
    const list = el('ul', 'tgnb-leftover-list');
    for (const left of leftovers) {
      const item = el('li', 'tgnb-leftover');
      item.dataset.resource = left.id;
      const cost =
        left.cost === null ? 'price unknown' : `${money(left.cost, left.currency)} so far`;
      item.append(
        el('div', 'tgnb-run-head', `${left.id} · ${left.base_model} · ${left.gpus} GPU(s)`),
        el('div', 'tgnb-muted', `${left.status} · ${cost} (${left.source})`)
      );
      item.title = left.line;
      list.appendChild(item);
    }
    this.leftoversNode.append(list, el('div', 'tgnb-muted', `stop them: ${stop}`));
  }

  addEvent(event: IEvent): void {
    const item = el('li', `tgnb-event tgnb-reason-${event.reason}`);
    item.appendChild(el('span', 'tgnb-time', localTime(event.time)));
    item.appendChild(el('span', 'tgnb-reason', event.reason));
    const where = [event.node, event.run].filter(Boolean).join(' · ');
    if (where) {
      item.appendChild(el('span', 'tgnb-where', where));
    }
    if (event.message) {
      item.appendChild(el('span', 'tgnb-message', localTimes(event.message)));
    }
    item.title = localTimes(event.message);
    this.eventsNode.insertBefore(item, this.eventsNode.firstChild);
    while (this.eventsNode.childElementCount > MAX_EVENTS) {
      this.eventsNode.lastElementChild?.remove();
    }
  }

  private renderCluster(): void {
    const c = this._cluster;
    this.clusterNode.replaceChildren();
    this.capacityNode.replaceChildren();
    if (c === null) {
      const link = el('button', 'jp-Button jp-mod-accept tgnb-attach', 'Attach');
      link.title = 'attach to a cluster (empty name: the default, the local emulator without a key)';
      link.dataset.testid = 'tgnb-attach';
      link.onclick = () => this.actions.attach();
      const state = this.detachedReason ? 'disconnected' : 'not attached yet';
      const status = el('div', 'tgnb-muted', state);
      status.dataset.testid = 'tgnb-detached';
      this.clusterNode.append(status);
      const reason = this.detachedReason || this.unattachedReason;
      if (reason) {
        this.clusterNode.append(el('div', 'tgnb-muted tgnb-reason-text', reason));
      }
      this.clusterNode.append(link);
      this.enableScale(false);
      return;
    }
    this.unattachedReason = '';
    this.enableScale(true);
    const name = el('div', 'tgnb-cluster-name', c.name);
    name.title = c.id;
    const where = [c.type, c.phase ?? c.status, c.gpu_type, c.region, c.backend]
      .filter(Boolean)
      .join(' · ');
    this.clusterNode.append(name, el('div', 'tgnb-muted', where));
    const desired = c.desired_preemptible_gpus;
    const allocated = c.allocated_preemptible_gpus;
    const text = el('div', 'tgnb-capacity-text');
    text.append(
      el('span', '', 'preemptible GPUs: allocated '),
      Object.assign(el('b', '', String(allocated)), { title: 'allocated' }),
      el('span', '', ' / desired '),
      Object.assign(el('b', '', String(desired)), { title: 'desired' })
    );
    text.dataset.allocated = String(allocated);
    text.dataset.desired = String(desired);
    this.capacityNode.append(
      text,
      bar(desired > 0 ? allocated / desired : 1, c.capacity_reached ? 'tgnb-ok' : 'tgnb-short'),
      el('div', 'tgnb-muted', `standard GPUs: ${c.standard_gpus} · nodes: ${c.nodes.length}`)
    );
    if (c.prices) {
      const p = c.prices;
      const rates = el(
        'div',
        'tgnb-muted tgnb-prices',
        `${money(p.standard, p.currency)}/GPU-h standard · ${money(p.preemptible, p.currency)}/GPU-h preemptible`
      );
      rates.title = `prices from ${p.source}`;
      this.capacityNode.append(rates);
    }
  }

  private renderRuns(): void {
    this.runsNode.replaceChildren();
    if (this._runs.length === 0) {
      this.runsNode.appendChild(el('li', 'tgnb-muted', 'no runs on this cluster'));
      return;
    }
    const filter = this.filterNode.value.trim();
    const shown = orderRuns(this._runs).filter(run => runMatches(run, filter));
    if (shown.length === 0) {
      const none = `no runs match "${filter}" (${this._runs.length} on this cluster)`;
      this.runsNode.appendChild(el('li', 'tgnb-muted', none));
      return;
    }
    for (const run of shown) {
      const item = el('li', `tgnb-run tgnb-state-${run.state}`);
      item.dataset.run = run.name;
      const head = el('div', 'tgnb-run-head');
      head.append(el('span', 'tgnb-run-name', run.name), el('span', 'tgnb-badge', run.state));
      const open = el('button', 'jp-Button tgnb-link', 'timeline');
      open.onclick = () => this.actions.openTimeline(run.name);
      head.appendChild(open);
      const logs = el('button', 'jp-Button tgnb-link', 'logs');
      logs.title = "the run's output, live, each attempt marked";
      logs.dataset.testid = 'tgnb-run-logs';
      logs.onclick = () => this.actions.openLogs(run.name);
      head.appendChild(logs);
      const steps =
        run.step === null
          ? 'steps unknown'
          : run.max_steps
            ? `${run.step}/${run.max_steps} steps`
            : `${run.step} steps`;
      const spent = spending(run);
      const info = [steps, `restarts ${run.restart_count}`, spent, run.nodes.join(',')].filter(
        Boolean
      );
      item.append(head, bar(run.progress ?? 0, 'tgnb-progress'));
      item.appendChild(el('div', 'tgnb-muted', info.join(' · ')));
      for (const line of run.groups ?? []) {
        const group = el('div', 'tgnb-muted tgnb-groups', line);
        group.dataset.testid = 'tgnb-run-groups';
        item.appendChild(group);
      }
      if (run.detail) {
        item.title = run.detail;
      }
      this.runsNode.appendChild(item);
    }
  }

  private _cluster: ICluster | null = null;
  private detachedReason = '';
  private unattachedReason = '';
  private scaleButtons: HTMLButtonElement[] = [];
  private _runs: IRun[] = [];
  private pending = 0;
  private pendingNode!: HTMLElement;
  private clusterNode: HTMLElement;
  private capacityNode: HTMLElement;
  private errorNode: HTMLElement;
  private runsNode: HTMLElement;
  private filterNode: HTMLInputElement;
  private eventsNode: HTMLElement;
  private leftoversNode: HTMLElement;
  private sweepsNode: HTMLElement;
  private _sweeps: ISweep[] = [];
}

/** `$1.23` (`$0.0042` under a cent), as tgnb writes amounts (`tgnb.prices.money`). */
/** A time as the sidebar shows it: the browser's local time of day, 24-hour. */
export function localTime(when: string | Date): string {
  const date = when instanceof Date ? when : new Date(when);
  if (Number.isNaN(date.getTime())) {
    return String(when);
  }
  return date.toLocaleTimeString([], { hour12: false });
}

const ISO_TIME = /\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?/g;

/** `text` with every ISO 8601 timestamp in it (a drain window's end...) as `localTime` writes it. */
export function localTimes(text: string): string {
  return text.replace(ISO_TIME, iso => localTime(iso));
}

export function money(amount: number, currency = 'USD'): string {
  const digits = amount !== 0 && Math.abs(amount) < 0.01 ? 4 : 2;
  const text = amount.toLocaleString('en-US', {
    minimumFractionDigits: digits,
    maximumFractionDigits: digits
  });
  return currency === 'USD' ? `$${text}` : `${text} ${currency}`;
}

/** A run's dollars so far: `$0.06 spent`, or `$0.06 of $5.00 budget` when it has one ('' when
 * no price is known). */
export function spending(run: IRun): string {
  if (run.cost_usd === null || run.cost_usd === undefined) {
    return '';
  }
  const budget = run.budget_usd ? ` of ${money(run.budget_usd)} budget` : ' spent';
  return `${money(run.cost_usd)}${budget}`;
}

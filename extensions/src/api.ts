/**
 * The browser side of the tgnb server extension's HTTP API (`/tgnb/...`).
 *
 * Requests go through `ServerConnection.makeRequest`, which adds the server's token and XSRF
 * header; the Together API key never leaves the server.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

export interface INode {
  name: string;
  kind: string;
  gpus: number;
  status: string;
  phase: string | null;
  /** when the node entered its phase (ISO 8601), if known */
  since: string | null;
}

export interface ICluster {
  id: string;
  name: string;
  type: string;
  status: string;
  phase: string | null;
  region: string;
  gpu_type: string;
  standard_gpus: number;
  desired_preemptible_gpus: number;
  allocated_preemptible_gpus: number;
  capacity_reached: boolean;
  nodes: INode[];
  /** when the server read it (ISO 8601); the event stream's `cluster` messages leave it out */
  fetched_at?: string;
  backend?: string;
  local?: boolean;
  prices?: IPrices | null;
}

/** Dollars per GPU-hour of each node class, and where they came from (`tgnb.prices`). */
export interface IPrices {
  standard: number;
  preemptible: number;
  currency: string;
  source: string;
}

export interface IRun {
  id: string;
  name: string;
  state: string;
  finished: boolean;
  backend: string;
  algorithm: string;
  restart_count: number;
  nodes: string[];
  exit_code: number | null;
  detail: string;
  /** seconds since the epoch */
  created_at?: number | null;
  /** null: unknown, the program reports no steps (never 0) */
  step: number | null;
  max_steps: number | null;
  progress: number | null;
  gpu_hours?: number;
  cost_usd?: number | null;
  budget_usd?: number | null;
  /** replica groups (fault_tolerance="torchft"): a line for the groups, then one per group that
   * left early and per replacement (from whom and at which step it healed); [] for other runs */
  groups: string[];
  /** GET /tgnb/runs/NAME only: the run's state changes and its own events */
  history?: IRunChange[];
  events?: IEvent[];
}

/** One state change of a run (`Run.history`). */
export interface IRunChange {
  /** seconds since the epoch */
  time: number;
  state: string;
  detail: string;
  node: string | null;
}

/** A Post-Training model resource tgnb created that still bills while the process that created
 * it is gone (`tgnb.ptregistry`), with what it has cost from the platform's own numbers. */
export interface ILeftover {
  id: string;
  base_model: string;
  gpus: number;
  status: string;
  since: string | null;
  cost: number | null;
  currency: string;
  per_hour: number | null;
  source: string;
  line: string;
}

export interface IEvent {
  time: string;
  source: string;
  reason: string;
  message: string;
  node?: string;
  run?: string;
  data?: { [key: string]: unknown };
}

/** A sweep: a named group of runs (`tgnb.runs.sweeps.Sweep`, GET /tgnb/sweeps). */
export interface ISweep {
  name: string;
  source: string;
  created_at: number;
  runs: string[];
  /** how many runs are in each state */
  states: Record<string, number>;
  finished: boolean;
  cost_usd: number | null;
  best: string | null;
  best_metric: string | null;
  best_value: number | null;
  /** GET /tgnb/sweeps/NAME only: a row per run */
  rows?: ISweepRow[];
}

/** One run of a sweep as its table shows it (null: not known). */
export interface ISweepRow {
  run: string;
  state: string;
  steps: number | null;
  max_steps: number | null;
  lost: number | null;
  preemptions: number;
  restarts: number;
  cost_usd: number | null;
  metric: string | null;
  best: number | null;
  best_step: number | null;
  note: string | null;
}

export type Message =
  | { type: 'cluster'; cluster: ICluster }
  | { type: 'runs'; runs: IRun[] }
  | { type: 'event'; event: IEvent; live: boolean }
  | { type: 'run_state'; run: string; from: string | null; to: string }
  | { type: 'detached'; message: string }
  | { type: 'error'; message: string };

function url(path: string): string {
  const settings = ServerConnection.makeSettings();
  return URLExt.join(settings.baseUrl, 'tgnb', path);
}

/** Call the API; a non-2xx answer throws an Error carrying the server's one-line message. */
export async function request<T>(path: string, init: RequestInit = {}): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const response = await ServerConnection.makeRequest(url(path), init, settings);
  const text = await response.text();
  let data: unknown = text;
  if (text.length > 0 && (response.headers.get('Content-Type') ?? '').includes('json')) {
    data = JSON.parse(text);
  }
  if (!response.ok) {
    const message = (data as { message?: string })?.message;
    throw new Error(message ?? `${response.status} ${response.statusText}`);
  }
  return data as T;
}

export function getStatus(): Promise<{ attached: boolean; cluster: ICluster | null }> {
  return request('status');
}

export function getCluster(): Promise<ICluster> {
  return request<ICluster>('cluster');
}

export function attach(cluster: string | null): Promise<ICluster> {
  return request<ICluster>('attach', { method: 'POST', body: JSON.stringify({ cluster }) });
}

export function scale(preemptible: number): Promise<ICluster> {
  return request<ICluster>('scale', {
    method: 'POST',
    body: JSON.stringify({ preemptible })
  });
}

export async function getRuns(): Promise<IRun[]> {
  return (await request<{ runs: IRun[] }>('runs')).runs;
}

export function getLeftovers(): Promise<{ leftovers: ILeftover[]; stop: string }> {
  return request('posttraining/leftovers');
}

export function getTimeline(run: string): Promise<string> {
  return request<string>(`runs/${encodeURIComponent(run)}/timeline`);
}

export async function getSweeps(): Promise<ISweep[]> {
  return (await request<{ sweeps: ISweep[] }>('sweeps')).sweeps;
}

export function getSweep(name: string): Promise<ISweep> {
  return request<ISweep>(`sweeps/${encodeURIComponent(name)}`);
}

export function getSweepChart(name: string): Promise<string> {
  return request<string>(`sweeps/${encodeURIComponent(name)}/chart`);
}

export async function stopSweep(name: string): Promise<string[]> {
  const path = `sweeps/${encodeURIComponent(name)}/stop`;
  return (await request<{ stopped: string[] }>(path, { method: 'POST', body: '{}' })).stopped;
}

/**
 * The server-sent event stream of `/tgnb/events`, read with fetch so that token and cookie
 * authentication both work; it reconnects after a pause and resumes after the last message.
 */
export class EventStream {
  constructor(private onMessage: (message: Message) => void) {}

  start(): void {
    void this.loop();
  }

  dispose(): void {
    this.disposed = true;
    this.controller?.abort();
  }

  private async loop(): Promise<void> {
    while (!this.disposed) {
      try {
        await this.readOnce();
      } catch {
        if (this.disposed) {
          return;
        }
      }
      await new Promise(resolve => setTimeout(resolve, 2000));
    }
  }

  private async readOnce(): Promise<void> {
    const settings = ServerConnection.makeSettings();
    this.controller = new AbortController();
    const response = await ServerConnection.makeRequest(
      url(`events?since=${this.since}`),
      { signal: this.controller.signal },
      settings
    );
    if (!response.ok || !response.body) {
      throw new Error(`event stream: ${response.status}`);
    }
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = '';
    for (;;) {
      const { done, value } = await reader.read();
      if (done) {
        return;
      }
      buffer += decoder.decode(value, { stream: true });
      let cut = buffer.indexOf('\n\n');
      while (cut >= 0) {
        this.dispatch(buffer.slice(0, cut));
        buffer = buffer.slice(cut + 2);
        cut = buffer.indexOf('\n\n');
      }
    }
  }

  private dispatch(block: string): void {
    let data = '';
    for (const line of block.split('\n')) {
      if (line.startsWith('id: ')) {
        this.since = parseInt(line.slice(4), 10) || this.since;
      } else if (line.startsWith('data: ')) {
        data += line.slice(6);
      }
    }
    if (data) {
      this.onMessage(JSON.parse(data) as Message);
    }
  }

  private since = 0;
  private disposed = false;
  private controller: AbortController | null = null;
}

/**
 * A sweep in the main area, as `%tg sweep NAME` shows it in a cell: one table of its runs
 * (state, steps, lost, preemptions, cost, best metric) over one chart of their curves with a
 * marker at each preemption, and one stop for every run (`tgnb.runs.sweeps.Sweep`). It reads
 * `GET /tgnb/sweeps/<name>` and its chart again every `SWEEP_POLL_MS` until every run has ended.
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { getSweep, getSweepChart, ISweep, ISweepRow, stopSweep } from './api';

/** How often an open sweep is read again while a run of it goes on (milliseconds). */
export const SWEEP_POLL_MS = 3000;

function money(amount: number | null): string {
  if (amount === null) {
    return 'price unknown';
  }
  const digits = amount !== 0 && Math.abs(amount) < 0.01 ? 4 : 2;
  return `$${amount.toFixed(digits)}`;
}

function bestText(metric: string | null, value: number | null, step: number | null): string {
  if (metric === null || value === null) {
    return '-';
  }
  const at = step === null ? '' : ` @ step ${step}`;
  return `${metric} ${Number(value.toPrecision(4))}${at}`;
}

/** `3 runs · 2 running, 1 succeeded · $0.42 · best halves-1 (result 2.5)`: a sweep in a line. */
export function sweepLine(sweep: ISweep): string {
  const n = sweep.runs.length;
  const states = Object.entries(sweep.states)
    .sort(([a], [b]) => a.localeCompare(b))
    .map(([state, count]) => `${count} ${state}`)
    .join(', ');
  const parts = [`${n} run${n === 1 ? '' : 's'}`, states, money(sweep.cost_usd)];
  if (sweep.best !== null) {
    parts.push(`best ${sweep.best} (${bestText(sweep.best_metric, sweep.best_value, null)})`);
  }
  return parts.filter(Boolean).join(' · ');
}

/** The cells of a run's row, in the table's order. */
export function rowCells(row: ISweepRow): string[] {
  const steps = row.steps === null ? '?' : String(row.steps);
  return [
    row.run,
    row.state,
    row.max_steps ? `${steps}/${row.max_steps}` : steps,
    row.lost === null ? '?' : String(row.lost),
    String(row.preemptions),
    money(row.cost_usd),
    bestText(row.metric, row.best, row.best_step)
  ];
}

const HEAD = ['run', 'state', 'steps', 'lost', 'preemptions', 'cost', 'best'];

/** Ask before stopping every unfinished run of a sweep; true when the user confirmed. */
export async function confirmStopSweep(sweep: string, running: number): Promise<boolean> {
  const result = await showDialog({
    title: 'Stop a sweep',
    body:
      `Stop the ${running} unfinished run(s) of sweep ${sweep}? Each saves a checkpoint first; ` +
      'a run stopped is not started again.',
    buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Stop' })]
  });
  return result.button.accept;
}

export class SweepView extends Widget {
  constructor(readonly sweep: string) {
    super();
    this.addClass('tgnb-SweepView');
    this.node.dataset.testid = 'tgnb-sweep-view';
    this.node.dataset.sweep = sweep;
    this.headNode = document.createElement('div');
    this.headNode.className = 'tgnb-sweep-head';
    this.stopButton = document.createElement('button');
    this.stopButton.className = 'jp-Button tgnb-link';
    this.stopButton.textContent = 'stop every run';
    this.stopButton.dataset.testid = 'tgnb-sweep-stop';
    this.stopButton.onclick = () => void this.stop();
    this.statusNode = document.createElement('div');
    this.statusNode.className = 'tgnb-muted';
    this.statusNode.dataset.testid = 'tgnb-sweep-status';
    this.tableNode = document.createElement('table');
    this.tableNode.className = 'tgnb-sweep-table';
    this.tableNode.dataset.testid = 'tgnb-sweep-table';
    this.chartNode = document.createElement('img');
    this.chartNode.className = 'tgnb-sweep-chart';
    this.chartNode.alt = `chart of sweep ${sweep}: each run's curve and its preemptions`;
    this.node.append(this.headNode, this.stopButton, this.statusNode, this.tableNode, this.chartNode);
    void this.loop();
  }

  dispose(): void {
    this.closed = true;
    if (this.chartNode.src) {
      URL.revokeObjectURL(this.chartNode.src);
    }
    super.dispose();
  }

  private async loop(): Promise<void> {
    while (!this.closed) {
      const finished = await this.read();
      if (finished) {
        return;
      }
      await new Promise(resolve => window.setTimeout(resolve, SWEEP_POLL_MS));
    }
  }

  /** Read the sweep and its chart once; whether every run has ended. */
  async read(): Promise<boolean> {
    let sweep: ISweep;
    let svg: string;
    try {
      [sweep, svg] = await Promise.all([getSweep(this.sweep), getSweepChart(this.sweep)]);
    } catch (error) {
      this.statusNode.textContent = error instanceof Error ? error.message : String(error);
      return false;
    }
    this.headNode.textContent = `Sweep ${sweep.name}: ${sweepLine(sweep)}`;
    this.running = sweep.runs.length - (sweep.rows ?? []).filter(r => ENDED.has(r.state)).length;
    this.stopButton.disabled = sweep.finished;
    this.stopButton.title = sweep.finished ? 'every run has ended' : 'stop every unfinished run';
    this.statusNode.textContent = sweep.finished ? 'every run has ended' : 'following…';
    const head = document.createElement('tr');
    for (const h of HEAD) {
      const th = document.createElement('th');
      th.textContent = h;
      head.appendChild(th);
    }
    const rows = (sweep.rows ?? []).map(row => {
      const tr = document.createElement('tr');
      tr.dataset.run = row.run;
      for (const text of rowCells(row)) {
        const td = document.createElement('td');
        td.textContent = row.run === sweep.best && text === rowCells(row)[6] ? `★ ${text}` : text;
        tr.appendChild(td);
      }
      return tr;
    });
    this.tableNode.replaceChildren(head, ...rows);
    const old = this.chartNode.src;
    this.chartNode.src = URL.createObjectURL(new Blob([svg], { type: 'image/svg+xml' }));
    if (old) {
      URL.revokeObjectURL(old);
    }
    return sweep.finished;
  }

  private async stop(): Promise<void> {
    if (!(await confirmStopSweep(this.sweep, this.running))) {
      return;
    }
    try {
      const stopped = await stopSweep(this.sweep);
      this.statusNode.textContent = stopped.length
        ? `stop requested for ${stopped.join(', ')}`
        : 'every run had already ended';
    } catch (error) {
      this.statusNode.textContent = error instanceof Error ? error.message : String(error);
    }
    void this.read();
  }

  private closed = false;
  private running = 0;
  private headNode: HTMLElement;
  private stopButton: HTMLButtonElement;
  private statusNode: HTMLElement;
  private tableNode: HTMLTableElement;
  private chartNode: HTMLImageElement;
}

const ENDED = new Set(['succeeded', 'failed', 'cancelled']);

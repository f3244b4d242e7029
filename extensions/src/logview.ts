/**
 * A run's live log in the main area, the view `run.logs(follow=True)` and `%tg logs RUN -f` print
 * in a cell: each attempt after a header line (its node, its start, how the one before ended),
 * the program's lines as they are written, and a last line with how the run ended. It reads
 * `GET /tgnb/runs/<name>/logs` after its cursor every `LOG_POLL_MS` until the run has ended.
 */
import { Widget } from '@lumino/widgets';

import { request } from './api';

/** One line of a run's live log: an attempt's header, the program's output, or the run's end. */
export interface ILogLine {
  kind: 'attempt' | 'output' | 'end';
  text: string;
}

/** A page of a run's live log after a cursor (`tgnb.runs.livelog.page`); pass `cursor` and
 * `attempt` back to read what follows, until `done`. */
export interface ILogPage {
  lines: ILogLine[];
  cursor: number;
  attempt: number;
  done: boolean;
}

/** `GET /tgnb/runs/<run>/logs`: what the run's log holds after `cursor`. */
export function getLogs(run: string, cursor: number, attempt: number): Promise<ILogPage> {
  return request<ILogPage>(
    `runs/${encodeURIComponent(run)}/logs?cursor=${cursor}&attempt=${attempt}`
  );
}

/** How often an open log reads what was written since (milliseconds). */
export const LOG_POLL_MS = 1000;
/** Most lines a log view keeps (the oldest go first; the run's own log keeps every line). */
export const MAX_LOG_LINES = 20000;

export class RunLogView extends Widget {
  constructor(readonly run: string) {
    super();
    this.addClass('tgnb-LogView');
    this.node.dataset.testid = 'tgnb-log';
    this.node.dataset.run = run;
    this.statusNode = document.createElement('div');
    this.statusNode.className = 'tgnb-muted tgnb-log-status';
    this.statusNode.dataset.testid = 'tgnb-log-status';
    this.statusNode.textContent = 'following…';
    this.linesNode = document.createElement('pre');
    this.linesNode.className = 'tgnb-log-lines';
    this.linesNode.dataset.testid = 'tgnb-log-lines';
    this.node.append(this.statusNode, this.linesNode);
    void this.loop();
  }

  /** Whether the run has ended and every line was read. */
  get done(): boolean {
    return this._done;
  }

  dispose(): void {
    this.stopped = true;
    super.dispose();
  }

  private async loop(): Promise<void> {
    while (!this.stopped && !this._done) {
      try {
        const page = await getLogs(this.run, this.cursor, this.attempt);
        this.cursor = page.cursor;
        this.attempt = page.attempt;
        this.append(page.lines);
        this._done = page.done;
        this.statusNode.textContent = page.done ? 'the run has ended' : 'following…';
        if (page.done || page.lines.length > 0) {
          continue; // more may be waiting: read again at once
        }
      } catch (error) {
        this.statusNode.textContent = `could not read the log: ${
          error instanceof Error ? error.message : String(error)
        } (trying again)`;
      }
      await new Promise(resolve => setTimeout(resolve, LOG_POLL_MS));
    }
  }

  private append(lines: ILogLine[]): void {
    if (lines.length === 0) {
      return;
    }
    const box = this.node;
    const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 24;
    for (const line of lines) {
      const row = document.createElement('div');
      row.className = `tgnb-log-${line.kind}`;
      row.textContent = line.text;
      this.linesNode.appendChild(row);
    }
    while (this.linesNode.childElementCount > MAX_LOG_LINES) {
      this.linesNode.firstElementChild?.remove();
    }
    if (atBottom) {
      box.scrollTop = box.scrollHeight;
    }
  }

  private cursor = 0;
  private attempt = -1;
  private _done = false;
  private stopped = false;
  private statusNode: HTMLElement;
  private linesNode: HTMLElement;
}

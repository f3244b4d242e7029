/**
 * tgnb's JupyterLab extension: a Together sidebar (cluster, preemptible capacity, runs, events),
 * notifications on preemption notices and on runs resumed or failed, and palette commands to
 * attach, scale and open a run's timeline. Everything goes through the tgnb server extension.
 */
import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import {
  ICommandPalette,
  InputDialog,
  MainAreaWidget,
  Notification
} from '@jupyterlab/apputils';
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import * as api from './api';
import { RunLogView } from './logview';
import { confirmStopSweep, SweepView } from './sweepview';
import { confirmScale, GPUS_PER_NODE, localTime, localTimes, TogetherSidebar } from './sidebar';

const ICON_SVG =
  '<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">' +
  '<g class="jp-icon3" fill="#616161"><rect x="3" y="3" width="8" height="8" rx="1"/>' +
  '<rect x="13" y="3" width="8" height="8" rx="1"/><rect x="3" y="13" width="8" height="8" rx="1"/>' +
  '<rect x="13" y="13" width="8" height="8" rx="1" fill-opacity="0.4"/></g></svg>';

export const togetherIcon = new LabIcon({ name: 'tgnb:together', svgstr: ICON_SVG });

const CommandIDs = {
  attach: 'tgnb:attach',
  scale: 'tgnb:scale',
  timeline: 'tgnb:open-timeline',
  sidebar: 'tgnb:open-sidebar'
};

function errorText(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** How often a live sidebar with no cluster reads it again (milliseconds). */
const REATTACH_MS = 2000;
/** How often the sidebar looks for Post-Training resources left billing (ms). */
const LEFTOVERS_MS = 15000;

/** A notice older than this when it arrives is not toasted (ms): a page that opens or reconnects
 * is sent the recent past, which the sidebar's feed shows; a toast is for what happens now. */
export const STALE_MS = 60000;

/** Whether `message` is about an event older than `STALE_MS` (by this browser's clock). */
export function stale(message: api.Message, now: number = Date.now()): boolean {
  if (message.type !== 'event') {
    return false;
  }
  const at = Date.parse(message.event.time);
  return !Number.isNaN(at) && now - at > STALE_MS;
}

const SEEN_KEY = 'tgnb:toasted';
const SEEN_MAX = 500;

/** The identity of what a toast is about (an event, or a run's change of state). */
export function toastKey(message: api.Message): string | null {
  if (message.type === 'event') {
    const e = message.event;
    return ['event', e.source, e.node ?? '', e.run ?? '', e.reason, e.time].join('|');
  }
  if (message.type === 'run_state') {
    return ['run_state', message.run, message.to].join('|');
  }
  return null;
}

/** Whether a toast about `key` was shown already, in this page or an earlier load of it
 * (localStorage: a reload must not replay the preemption notices of an hour ago); marks it seen. */
export function firstTime(key: string, storage: Storage | null = window.localStorage): boolean {
  let seen: string[] = [];
  try {
    seen = JSON.parse(storage?.getItem(SEEN_KEY) ?? '[]') as string[];
  } catch {
    seen = [];
  }
  if (!Array.isArray(seen)) {
    seen = [];
  }
  if (seen.includes(key)) {
    return false;
  }
  seen.push(key);
  try {
    storage?.setItem(SEEN_KEY, JSON.stringify(seen.slice(-SEEN_MAX)));
  } catch {
    // storage full or disabled: the toast is still shown
  }
  return true;
}

/** Toasts for what a person watching training wants to know at once, each shown once. */
export function notify(message: api.Message): void {
  const wanted =
    (message.type === 'event' &&
      message.live &&
      ['TogetherPreemptionNotified', 'RunResumed'].includes(message.event.reason)) ||
    (message.type === 'run_state' && message.to === 'failed');
  const key = wanted && !stale(message) ? toastKey(message) : null;
  if (key === null || !firstTime(key)) {
    return;
  }
  if (message.type === 'event' && message.live) {
    const e = message.event;
    if (e.reason === 'TogetherPreemptionNotified') {
      const what = e.message ? localTimes(e.message) : `node ${e.node ?? '?'}`;
      Notification.warning(`${localTime(e.time)} Preemption notice: ${what}`, {
        autoClose: 15000
      });
    } else if (e.reason === 'RunResumed') {
      const step = e.data?.step;
      const from = step !== undefined ? ` from step ${step}` : '';
      Notification.info(`${localTime(e.time)} Run ${e.run ?? '?'} resumed${from}`, {
        autoClose: 10000
      });
    }
  } else if (message.type === 'run_state' && message.to === 'failed') {
    Notification.error(`Run ${message.run} failed`, { autoClose: false });
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'tgnb:sidebar',
  description: 'Together GPUs: cluster capacity, runs and preemption notifications',
  autoStart: true,
  requires: [ILabShell],
  optional: [ICommandPalette],
  activate: (app: JupyterFrontEnd, shell: ILabShell, palette: ICommandPalette | null) => {
    const refresh = async (): Promise<void> => {
      try {
        sidebar.setCluster(await api.getCluster());
        sidebar.setRuns(await api.getRuns());
        sidebar.setError('');
      } catch (error) {
        if (sidebar.cluster === null) {
          sidebar.setUnattached(errorText(error)); // a state with its fix, not an error
        } else {
          sidebar.setError(errorText(error));
        }
      }
      await readLeftovers();
      await readSweeps();
    };
    // The cluster's sweeps: read at each refresh and when the runs change (one read at a time)
    let readingSweeps = false;
    const readSweeps = async (): Promise<void> => {
      if (readingSweeps) {
        return;
      }
      readingSweeps = true;
      try {
        sidebar.setSweeps(await api.getSweeps());
      } catch {
        // no cluster attached yet: the runs' error line says why
      } finally {
        readingSweeps = false;
      }
    };
    // Post-Training resources left billing by a process that is gone: read at each refresh and
    // every LEFTOVERS_MS (the server asks the service only when its registry holds one)
    const readLeftovers = async (): Promise<void> => {
      try {
        const found = await api.getLeftovers();
        sidebar.setLeftovers(found.leftovers, found.stop);
      } catch {
        // the Post-Training service did not answer: the cluster's view stands without it
      }
    };

    const scaleTo = async (target: number): Promise<void> => {
      const cluster = sidebar.cluster ?? (await api.getCluster());
      if (!(await confirmScale(cluster, target))) {
        return;
      }
      try {
        sidebar.setCluster(await api.scale(target));
        sidebar.setError('');
        Notification.success(`Preemptible target of ${cluster.name} set to ${target} GPUs`, {
          autoClose: 5000
        });
      } catch (error) {
        sidebar.setError(errorText(error));
        Notification.error(errorText(error), { autoClose: 10000 });
      }
    };

    const openTimeline = async (run: string): Promise<void> => {
      let svg: string;
      try {
        svg = await api.getTimeline(run);
      } catch (error) {
        Notification.error(errorText(error), { autoClose: 10000 });
        return;
      }
      const content = new Widget();
      content.addClass('tgnb-Timeline');
      const img = document.createElement('img');
      img.alt = `timeline of run ${run}`;
      img.src = URL.createObjectURL(new Blob([svg], { type: 'image/svg+xml' }));
      content.node.appendChild(img);
      const widget = new MainAreaWidget({ content });
      widget.id = `tgnb-timeline-${run}`;
      widget.title.label = `Timeline: ${run}`;
      widget.title.icon = togetherIcon;
      widget.title.closable = true;
      widget.disposed.connect(() => URL.revokeObjectURL(img.src));
      shell.add(widget, 'main');
      shell.activateById(widget.id);
    };

    const openLogs = (run: string): void => {
      const id = `tgnb-logs-${run}`;
      const open = Array.from(shell.widgets('main')).find(w => w.id === id);
      if (open) {
        shell.activateById(id);
        return;
      }
      const widget = new MainAreaWidget({ content: new RunLogView(run) });
      widget.id = id;
      widget.title.label = `Log: ${run}`;
      widget.title.icon = togetherIcon;
      widget.title.closable = true;
      shell.add(widget, 'main');
      shell.activateById(widget.id);
    };

    const openSweep = (sweep: string): void => {
      const id = `tgnb-sweep-${sweep}`;
      if (Array.from(shell.widgets('main')).some(w => w.id === id)) {
        shell.activateById(id);
        return;
      }
      const widget = new MainAreaWidget({ content: new SweepView(sweep) });
      widget.id = id;
      widget.title.label = `Sweep: ${sweep}`;
      widget.title.icon = togetherIcon;
      widget.title.closable = true;
      shell.add(widget, 'main');
      shell.activateById(widget.id);
    };

    const stopSweep = async (sweep: string): Promise<void> => {
      const shown = sidebar.sweeps.find(s => s.name === sweep);
      const running = shown ? shown.runs.length - ended(shown.states) : 0;
      if (!(await confirmStopSweep(sweep, running))) {
        return;
      }
      try {
        const stopped = await api.stopSweep(sweep);
        const said = stopped.length
          ? `Stop requested for ${stopped.length} run(s) of sweep ${sweep}`
          : `Every run of sweep ${sweep} had already ended`;
        Notification.info(said, { autoClose: 5000 });
      } catch (error) {
        Notification.error(errorText(error), { autoClose: 10000 });
      }
      await readSweeps();
    };

    const stream = new api.EventStream(message => {
      switch (message.type) {
        case 'cluster':
          sidebar.setCluster(message.cluster);
          sidebar.setError('');
          break;
        case 'detached':
          sidebar.setDetached(message.message);
          break;
        case 'runs':
          sidebar.setRuns(message.runs);
          void readSweeps();
          break;
        case 'event':
          sidebar.addEvent(message.event);
          break;
        case 'error':
          if (sidebar.cluster === null) {
            sidebar.setUnattached(message.message);
          } else {
            sidebar.setError(message.message);
          }
          break;
      }
      notify(message);
    });
    // Nothing is attached until the person opens the sidebar or runs a command (or the server
    // has attached already): opening JupyterLab alone starts no emulator and sends no request.
    // Once live, while no cluster is attached (none yet, or the platform stopped answering), the
    // cluster is read again every few seconds: an emulator started or restarted (on any port)
    // after the page opened is found without a reload. A read starts no emulator.
    let live = false;
    let reading = false;
    const retry = async (): Promise<void> => {
      if (sidebar.cluster === null && !reading) {
        reading = true;
        await refresh();
        reading = false;
      }
    };
    const goLive = (): void => {
      if (!live) {
        live = true;
        stream.start();
        void refresh();
        window.setInterval(() => void retry(), REATTACH_MS);
        window.setInterval(() => void readLeftovers(), LEFTOVERS_MS);
      }
    };

    const sidebar = new TogetherSidebar({
      shown: goLive,
      scale: scaleTo,
      openTimeline: run => void openTimeline(run),
      openLogs,
      openSweep,
      stopSweep: sweep => stopSweep(sweep),
      attach: () => void app.commands.execute(CommandIDs.attach)
    });
    sidebar.title.icon = togetherIcon;
    shell.add(sidebar, 'left', { rank: 900 });

    void api.getStatus().then(
      status => status.attached && goLive(),
      () => undefined
    );

    app.commands.addCommand(CommandIDs.sidebar, {
      label: 'Together: show the GPU sidebar',
      execute: () => {
        goLive();
        shell.activateById(sidebar.id);
      }
    });
    app.commands.addCommand(CommandIDs.attach, {
      label: 'Together: attach to a cluster',
      execute: async () => {
        const answer = await InputDialog.getText({
          title: 'Attach to a Together cluster',
          label: 'Cluster name or id (empty: the default cluster)',
          text: sidebar.cluster?.name ?? ''
        });
        if (!answer.button.accept) {
          return;
        }
        try {
          sidebar.setCluster(await api.attach(answer.value?.trim() || null));
          goLive();
          sidebar.setRuns(await api.getRuns());
          sidebar.setError('');
          shell.activateById(sidebar.id);
        } catch (error) {
          Notification.error(errorText(error), { autoClose: 10000 });
        }
      }
    });
    app.commands.addCommand(CommandIDs.scale, {
      label: 'Together: scale preemptible GPUs',
      execute: async () => {
        goLive();
        const cluster = sidebar.cluster ?? (await api.getCluster());
        const top = Math.max(64, cluster.desired_preemptible_gpus + 4 * GPUS_PER_NODE);
        const items: string[] = [];
        for (let n = 0; n <= top; n += GPUS_PER_NODE) {
          items.push(String(n));
        }
        const answer = await InputDialog.getItem({
          title: `Preemptible GPU target of ${cluster.name}`,
          items,
          current: String(cluster.desired_preemptible_gpus)
        });
        if (answer.button.accept && answer.value !== null) {
          await scaleTo(parseInt(answer.value, 10));
        }
      }
    });
    app.commands.addCommand(CommandIDs.timeline, {
      label: "Together: open a run's timeline",
      execute: async args => {
        let run = args['run'] as string | undefined;
        if (!run) {
          const runs = sidebar.runs.length ? sidebar.runs : await api.getRuns();
          if (runs.length === 0) {
            Notification.info('No runs on this cluster yet', { autoClose: 5000 });
            return;
          }
          const answer = await InputDialog.getItem({
            title: 'Open the timeline of run',
            items: runs.map(r => r.name)
          });
          if (!answer.button.accept || !answer.value) {
            return;
          }
          run = answer.value;
        }
        await openTimeline(run);
      }
    });
    if (palette) {
      for (const command of Object.values(CommandIDs)) {
        palette.addItem({ command, category: 'Together' });
      }
    }
  }
};

export default plugin;

/** How many runs of a sweep have ended, from its runs by state. */
function ended(states: Record<string, number>): number {
  return ['succeeded', 'failed', 'cancelled'].reduce((n, s) => n + (states[s] ?? 0), 0);
}

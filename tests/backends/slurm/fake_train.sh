#!/bin/bash
# Stands in for `python -m tgnb.train CONFIG --run-dir DIR` in the Slurm plumbing tests only (the
# training tests use the real runtime): it writes RunStarted/RunExited events like the runtime,
# prints what the job sees, sleeps for $FAKE_TRAIN_SLEEP seconds, and on the first run (the first
# $FAKE_TRAIN_EXITS runs) exits with $FAKE_TRAIN_FIRST_EXIT when set (75: checkpointed after a drain
# notice). With $FAKE_TRAIN_STEP it writes one metrics.jsonl row of that step first (the run's
# progress). Its knobs are the run's env (`conftest.fake_train`): the run's config is a real one.
# Called as: fake_train.sh -m tgnb.train CONFIG --run-dir DIR. Called for anything else (the run's
# placer job: -m tgnb.backends.slurm ...), it is the real interpreter.
[ "$2" = tgnb.train ] || exec python "$@"
run_dir=$5
sleep_s=${FAKE_TRAIN_SLEEP:-}
now() { date -u +%Y-%m-%dT%H:%M:%S.%NZ; }
echo "fake-train restart=${SLURM_RESTART_COUNT:-0} node=${SLURMD_NODENAME:-none} token_set=${TGNB_TEST_TOKEN:+yes}"
printf '{"time": "%s", "source": "run", "reason": "RunStarted", "data": {"restart": %d}}\n' \
  "$(now)" "${SLURM_RESTART_COUNT:-0}" >>"$run_dir/events.jsonl"
trap 'echo "fake-train: TERM"; exit 75' TERM
step=${FAKE_TRAIN_STEP:-}
[ -n "$step" ] && printf '{"step": %d, "loss": 0.0}\n' "$step" >>"$run_dir/metrics.jsonl"
sleep "${sleep_s:-1}" &
wait $!
first_exit=${FAKE_TRAIN_FIRST_EXIT:-}
exits=${FAKE_TRAIN_EXITS:-}
if [ -n "$first_exit" ] && [ "${SLURM_RESTART_COUNT:-0}" -lt "${exits:-1}" ]; then
  echo "fake-train: exiting $first_exit on run ${SLURM_RESTART_COUNT:-0}"
  exit "$first_exit"
fi
printf '{"time": "%s", "source": "run", "reason": "RunExited", "data": {"exit_code": 0}}\n' \
  "$(now)" >>"$run_dir/events.jsonl"
echo "fake-train: done"

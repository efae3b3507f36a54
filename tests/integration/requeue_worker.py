"""A worker for test_requeue.py, as a training program that resumes would be: it reads the step it
saved last (STATE_DIR/rank.R.step), says where it starts, then counts steps. Modes:

  save    on SIGUSR1, saves the step and exits 0 (a checkpoint before the time limit); once the job
          has been requeued FINISH_AT times (DDL_REQUEUE_COUNT) it finishes after 10 more steps
  ignore  ignores SIGUSR1 and never ends by itself (a program that does not save)

Usage: requeue_worker.py STATE_DIR MODE FINISH_AT [marker]. Each line names the rank, and the start
line DDL_REQUEUE_COUNT, Slurm's SLURM_RESTART_COUNT and the host."""
import os
import signal
import socket
import sys
import time

state_dir, mode, finish_at = sys.argv[1], sys.argv[2], int(sys.argv[3])  # (a marker may follow, for the tests to find it)
rank = int(os.environ["RANK"])
requeues = int(os.environ["DDL_REQUEUE_COUNT"])
state = os.path.join(state_dir, f"rank.{rank}.step")
step = int(open(state).read()) if os.path.exists(state) else 0


def save_and_exit(signum, frame):
    with open(state + ".tmp", "w") as f:
        f.write(str(step))
    os.replace(state + ".tmp", state)
    print(f"saved rank={rank} step={step}", flush=True)
    sys.exit(0)


signal.signal(signal.SIGUSR1, save_and_exit if mode == "save" else signal.SIG_IGN)  # before saying it started
print(f"start rank={rank} requeues={requeues} slurm={os.environ.get('SLURM_RESTART_COUNT', '-')} step={step} host={socket.gethostname()}",
      flush=True)
last = step + 10 if mode == "save" and requeues >= finish_at else None
while last is None or step < last:
    step += 1
    time.sleep(0.1)
print(f"done rank={rank} step={step}", flush=True)

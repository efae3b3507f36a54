"""A Lightning fit that resumes across requeues, as docs/run.md ("Requeue at the time limit")
tells Lightning users to write one; test_requeue.py runs it in a Slurm job under
`ddl run --requeue-signal USR1`.

Under ddl, Lightning takes its TorchElasticEnvironment, which installs no SIGUSR1 handler: the
signal ends each worker at once. The fit saves a checkpoint every 5 steps (ModelCheckpoint,
save_last) and every start fits with ckpt_path="last", so each start goes on from the last one. A
start after a requeue (DDL_REQUEUE_COUNT >= 1) trains 20 more steps and ends. Each rank prints

    lightning start rank=R requeues=N step=S      (the step the fit resumed at)
    lightning step rank=R step=S                  (every 5 steps, once a checkpoint holds it)
    lightning done rank=R requeues=N step=S weights=SHA256

Usage: lightning_requeue.py CHECKPOINT_DIR [marker]"""
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lightning_train import TinyRegression, data, pl, weights_hash  # noqa: E402

warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
warnings.filterwarnings("ignore", message=r".*srun.*")  # Lightning's own srun hint, in a Slurm job not started by srun
warnings.filterwarnings("ignore", message=r".*no last checkpoint available.*")  # the first start's

RANK = int(os.environ["RANK"])
REQUEUES = int(os.environ["DDL_REQUEUE_COUNT"])


class Resumable(TinyRegression):
    def on_train_start(self):
        super().on_train_start()
        self.started_at = self.trainer.global_step
        print(f"lightning start rank={RANK} requeues={REQUEUES} step={self.started_at}", flush=True)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        time.sleep(0.05)  # a step that takes time, so the signal finds the fit under way
        step = self.trainer.global_step
        if step % 5 == 0:
            print(f"lightning step rank={RANK} step={step}", flush=True)
        if REQUEUES >= 1 and step >= self.started_at + 20:
            self.trainer.should_stop = True  # every rank at the same step


def main():
    pl.seed_everything(1234, workers=True)
    checkpoints = pl.callbacks.ModelCheckpoint(dirpath=sys.argv[1], save_last=True, every_n_train_steps=5, save_top_k=0)
    trainer = pl.Trainer(strategy="ddp", accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]), max_epochs=100000,
                         callbacks=[checkpoints], logger=False, enable_progress_bar=False, enable_model_summary=False,
                         deterministic=True, default_root_dir=sys.argv[1])
    model = Resumable()
    trainer.fit(model, data(), ckpt_path="last")
    print(f"lightning done rank={RANK} requeues={REQUEUES} step={trainer.global_step} weights={weights_hash(model)}", flush=True)


if __name__ == "__main__":
    main()

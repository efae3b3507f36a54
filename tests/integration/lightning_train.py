"""A real PyTorch Lightning DDP fit (CPU, gloo) for one worker of `ddl run`; test_lightning.py runs it.
`--backend ddl` fits on libddl's torch.distributed backend instead (test_torch_backend.py), and
`--accelerator gpu` on the GPUs, one per rank (scripts/device_checks.sh, where a GPU is lent).

Lightning must take ddl's ranks (TORCHELASTIC_RUN_ID makes it pick TorchElasticEnvironment,
which reads RANK, WORLD_SIZE, LOCAL_RANK, GROUP_RANK) and must not start processes of its own:
each worker is already one process per rank. After two epochs on a tiny seeded data set each rank
prints

    lightning rank R of W local L node N weights SHA256

(SHA256 of the parameters' bytes; DDP keeps the replicas identical, so every rank prints the same
hash). Nothing is written to disk outside a temporary directory. Exits non-zero when anything is off.
Needs the venv of scripts/lightning_venv.sh (Lightning on Debian's torch 1.13), or any Python with
`pytorch_lightning` or the unified `lightning` package.
"""
import hashlib
import os
import sys
import tempfile
import warnings

import torch
from torch.utils.data import DataLoader, TensorDataset

try:
    import pytorch_lightning as pl
    from lightning_fabric.plugins.environments import TorchElasticEnvironment
except ImportError:  # only the unified package: its trainer takes its own environment classes
    import lightning.pytorch as pl
    from lightning.fabric.plugins.environments import TorchElasticEnvironment

# Only the one hint a tiny CPU data set always earns; every other warning (an srun one above all) shows.
warnings.filterwarnings("ignore", message=r".*does not have many workers.*")


class TinyRegression(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

    def _register_sharded_tensor_state_dict_hooks_if_available(self):
        """On torch < 2.1 Lightning registers ShardedTensor state-dict hooks here, importing
        torch.distributed._shard, which Debian's torch 1.13 cannot import on Python 3.11 (a dataclass
        with a mutable default: "ValueError: mutable default ... TensorProperties", fixed in torch
        2.0). This model has no ShardedTensor, so it needs no hooks."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def on_train_start(self):
        BACKEND_USED.append(torch.distributed.get_backend())  # what DDP's process group runs on


def data():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(64, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(64, 1, generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True, num_workers=0)


def weights_hash(model):
    digest = hashlib.sha256()
    for name, p in model.named_parameters():
        digest.update(name.encode())
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def children():
    """PIDs of this process's live children (any thread's)."""
    found = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                found += f.read().split()
        except OSError:
            pass
    return found


def fail(message):
    print(f"lightning_train: error: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


BACKEND_USED = []  # the torch.distributed backend Lightning's DDP ran on


def strategy():
    """"ddp" (gloo), or with `--backend ddl` DDP on libddl's torch.distributed backend."""
    if "--backend" not in sys.argv:
        return "ddp"
    backend = sys.argv[sys.argv.index("--backend") + 1]
    if backend == "ddl":
        import ddl.distributed  # noqa: F401  (registers the backend)
    return pl.strategies.DDPStrategy(process_group_backend=backend)


def accelerator():
    """"cpu", or what `--accelerator` names ("gpu": one GPU per rank)."""
    return sys.argv[sys.argv.index("--accelerator") + 1] if "--accelerator" in sys.argv else "cpu"


def main():
    for name in ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT"):
        if name not in os.environ:
            fail(f"{name} is not set: run me under `ddl run`")
    devices = int(os.environ["LOCAL_WORLD_SIZE"])
    if accelerator() == "gpu":  # cuBLAS refuses deterministic=True without it
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    num_nodes = int(os.environ.get("GROUP_WORLD_SIZE", "1"))
    pl.seed_everything(1234, workers=True)
    with tempfile.TemporaryDirectory(prefix="ddl-lightning-") as root:
        trainer = pl.Trainer(strategy=strategy(), accelerator=accelerator(), devices=devices, num_nodes=num_nodes, max_epochs=2,
                             logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, deterministic=True, default_root_dir=root)
        environment = trainer.strategy.cluster_environment
        if not isinstance(environment, TorchElasticEnvironment):
            fail(f"Lightning chose {type(environment).__name__}, not TorchElasticEnvironment")
        # Lightning's "popen" launcher starts the other ranks as copies of this script unless the
        # environment says they exist already; "spawn"/"fork" would start them in any case.
        launcher = type(trainer.strategy.launcher).__name__
        if not environment.creates_processes_externally or launcher != "_SubprocessScriptLauncher":
            fail(f"Lightning would start the workers itself (launcher {launcher})")
        # Trainer.fit asks SLURMEnvironment.detect() again whatever environment was chosen (to resume
        # an "hpc" checkpoint), and that warns on any machine with `srun` on PATH when SLURM did not
        # start the process ("The `srun` command is available on your system but is not used"):
        # noise here, where TorchElastic was just found to be the environment. Any other srun/SLURM
        # message still shows, and test_lightning.py fails on it.
        warnings.filterwarnings("ignore", message=r"The `srun` command is available on your system but is not used")
        model = TinyRegression()
        initial = weights_hash(model)
        trainer.fit(model, data())
        leftovers = os.listdir(root)
    if leftovers:
        fail(f"Lightning wrote {leftovers} (logger and checkpoints are off)")
    if children():
        fail(f"Lightning started processes of its own: {children()}")
    if trainer.state.status != "finished" or trainer.current_epoch != 2:
        fail(f"the fit did not finish its 2 epochs (status {trainer.state.status}, epoch {trainer.current_epoch})")
    expected = (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"]),
                int(os.environ.get("GROUP_RANK", "0")))
    got = (trainer.global_rank, trainer.world_size, trainer.local_rank, trainer.node_rank)
    if got != expected:
        fail(f"Lightning's (rank, world, local, node) {got} is not ddl's {expected}")
    final = weights_hash(model)
    if final == initial:
        fail("the fit left the weights as they were")
    rank, world, local, node = got
    print(f"lightning backend {BACKEND_USED[0]}", flush=True)
    print(f"lightning rank {rank} of {world} local {local} node {node} weights {final}", flush=True)


if __name__ == "__main__":
    main()

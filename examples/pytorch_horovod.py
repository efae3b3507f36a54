"""MNIST-shaped training in the style of the ALCF Horovod tutorial, with `import ddl.torch as hvd`.

The tutorial's script runs unchanged but for its import line: ddl.torch speaks horovod.torch's API
over libddl. Run it with ddl (the build tree's package is found through PYTHONPATH):

    PYTHONPATH=build/python ddl run -np 4 -- /usr/bin/python3 examples/pytorch_horovod.py
    PYTHONPATH=build/python ddl run -np 4 -- /usr/bin/python3 examples/pytorch_horovod.py --fp16-allreduce

What it does, as the tutorial does:

1. hvd.init(); pins the GPU of its local rank when there is one; 1 thread per worker on CPU.
2. A synthetic MNIST stand-in (28x28 images whose label decides where a bright blob sits), so it needs
   no download; a DistributedSampler gives each rank its own shard.
3. The tutorial's convolutional net; SGD with the learning rate scaled by hvd.size();
   hvd.DistributedOptimizer (optionally with fp16 compression of the gradients);
   hvd.broadcast_parameters and hvd.broadcast_optimizer_state from rank 0.
4. Each epoch, the test loss and accuracy averaged over ranks with hvd.allreduce (metric_average).
5. At the end, every rank hashes its parameters and rank 0 checks the replicas are identical (exit 1 if not).
"""

import argparse
import hashlib
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.data
import torch.utils.data.distributed

import ddl.torch as hvd


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--test-batch-size", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.5)
    parser.add_argument("--samples", type=int, default=4096, help="training images in all (split over ranks)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to fp16 for the allreduce")
    parser.add_argument("--no-cuda", action="store_true")
    return parser.parse_args()


def synthetic_mnist(samples, seed):
    """Images of noise with a bright 6x6 blob whose position (a 3x3 grid, plus one corner) is the label."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (samples,), generator=g)
    images = torch.rand(samples, 1, 28, 28, generator=g) * 0.3
    for i, label in enumerate(labels.tolist()):
        row, col = (label // 3, label % 3) if label < 9 else (3, 3)
        images[i, 0, 2 + 6 * row:8 + 6 * row, 2 + 6 * col:8 + 6 * col] += 0.7
    return torch.utils.data.TensorDataset((images - 0.1307) / 0.3081, labels)


class Net(nn.Module):
    """The tutorial's network."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


def metric_average(value, name):
    return hvd.allreduce(torch.tensor(value), name=name).item()


def train_epoch(model, optimizer, loader, sampler, epoch, device):
    model.train()
    sampler.set_epoch(epoch)
    for data, target in loader:
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()


def evaluate(model, loader, sampler, device):
    model.eval()
    loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            loss += F.nll_loss(output, target, reduction="sum").item()
            correct += output.argmax(dim=1).eq(target).sum().item()
    n = len(sampler)
    return metric_average(loss / n, "avg_loss"), metric_average(correct / n, "avg_accuracy")


def replicas_identical(model):
    sha = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        sha.update(name.encode())
        sha.update(p.detach().cpu().contiguous().numpy().tobytes())
    digests = hvd.allgather_object(sha.hexdigest())
    return all(d == digests[0] for d in digests), digests[0]


def main():
    args = parse_args()
    hvd.init()
    cuda = not args.no_cuda and torch.cuda.is_available()
    torch.manual_seed(args.seed)
    if cuda:
        torch.cuda.set_device(hvd.local_rank())
        torch.cuda.manual_seed(args.seed)
    else:
        torch.set_num_threads(1)
    device = torch.device("cuda" if cuda else "cpu")

    train_set = synthetic_mnist(args.samples, args.seed)
    test_set = synthetic_mnist(args.samples // 4, args.seed + 1)
    train_sampler = torch.utils.data.distributed.DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank())
    test_sampler = torch.utils.data.distributed.DistributedSampler(test_set, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    test_loader = torch.utils.data.DataLoader(test_set, batch_size=args.test_batch_size, sampler=test_sampler)

    model = Net().to(device)
    # The learning rate grows with the number of workers, whose batches add up to one large batch.
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=args.momentum)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), compression=compression)

    for epoch in range(1, args.epochs + 1):
        train_epoch(model, optimizer, train_loader, train_sampler, epoch, device)
        loss, accuracy = evaluate(model, test_loader, test_sampler, device)
        if hvd.rank() == 0:
            print(f"epoch {epoch}/{args.epochs} test loss {loss:.4f} accuracy {100 * accuracy:.1f}%", flush=True)

    same, digest = replicas_identical(model)
    if hvd.rank() == 0:
        print(f"replicas identical: {'yes' if same else 'NO'} (sha256 {digest[:16]})", flush=True)
    hvd.shutdown()
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

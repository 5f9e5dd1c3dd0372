# A PyTorch program written for Horovod, as Horovod's documentation writes one: the tests
# run it unchanged under `hvdrun --as-horovod` (and without the flag, where it must fail).
import torch
import torch.utils.data.distributed

import horovod.torch as hvd

# Initialize Horovod
hvd.init()

# Pin GPU to be used to process local rank (one GPU per process)
if torch.cuda.is_available():
    torch.cuda.set_device(hvd.local_rank())

# A different start on every rank: broadcast_parameters must make it one.
torch.manual_seed(1234 + hvd.rank())
inputs = torch.randn(64, 8)
targets = inputs.sum(dim=1, keepdim=True)
train_dataset = torch.utils.data.TensorDataset(inputs, targets)

# Partition dataset among workers using DistributedSampler
train_sampler = torch.utils.data.distributed.DistributedSampler(
    train_dataset, num_replicas=hvd.size(), rank=hvd.rank(), seed=0
)
train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=8, sampler=train_sampler)

model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)

# Add Horovod Distributed Optimizer
optimizer = hvd.DistributedOptimizer(
    optimizer, named_parameters=model.named_parameters(), compression=hvd.Compression.fp16
)

# Broadcast parameters from rank 0 to all other processes.
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

for epoch in range(3):
    train_sampler.set_epoch(epoch)
    for data, target in train_loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(data), target)
        loss.backward()
        optimizer.step()
    average = hvd.allreduce(loss.detach(), name="loss")
    if hvd.rank() == 0:
        print(f"epoch {epoch} loss {average.item():.4f}")

weights = hvd.allgather(model.weight.detach(), name="weights")
same = all(torch.equal(weights[0], row) for row in weights)
print(f"rank {hvd.rank()} of {hvd.size()}: weights the same on every rank: {same}")

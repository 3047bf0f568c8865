# exercise: average_gradients
# kind: honest
# mistake: averages only parameters named "weight" (forgets biases), so bias gradients stay per-rank and replicas diverge.
import torch.distributed as dist


def average_gradients(model):
    n = dist.get_world_size()
    for name, p in model.named_parameters():
        if p.grad is not None and name.endswith("weight"):
            dist.all_reduce(p.grad)
            p.grad /= n


ANSWER = average_gradients

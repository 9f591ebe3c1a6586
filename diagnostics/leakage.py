"""
The batch-statistic norms' leakage measurement for evaluations (nanonorm's, not a paper's). A norm that normalizes with
statistics of the whole batch (BatchNorm; PowerNorm §3) trains with each token seeing the rest of its batch, future
tokens included, and is evaluated with running statistics instead. The eval loss alone cannot show how much a training
loss gained from the batch: this measures the same eval batches with those norms in training mode, and PowerNorm §3's
distance between the batch's statistics and the running ones.
"""

import torch

# the norms that normalize a training token with statistics of the whole batch (PowerNorm §3; PowerNorm in warmup)
from norms import BATCH_STATISTIC_NORMS


class Leakage:
    """Per eval batch: L_B, the loss with the batch-statistic norms in training mode and the rest in eval mode (no
    dropout), then dist(s_B, s) = ||s_B - s|| / d for each statistic s (PowerNorm §3, Fig. 2 and 4), the mean over
    those norms (norms.distance). Nothing to measure in a model without a batch-statistic norm."""

    def __init__(self, model):
        self.model = model  # plain: forward hooks see nothing inside torch.compile
        self.norms = [m for m in model.modules() if isinstance(m, BATCH_STATISTIC_NORMS)]
        self.statistics = self.norms[0].STATISTICS if self.norms else ()

    def __len__(self):
        """The values measure() returns per batch."""
        return 1 + len(self.statistics) if self.norms else 0

    def measure(self, x, y):
        """The batch's L_B and distances, as one tensor (empty without a batch-statistic norm). The norms' buffers
        (running statistics, PowerNorm's call count) are put back as they were: an evaluation learns nothing."""
        if not self.norms:
            return torch.zeros(0, device=x.device)
        saved = [(module, name, buffer, buffer.clone()) for module in self.norms
                 for name, buffer in module.named_buffers(recurse=False)]
        distances = []
        hooks = [module.register_forward_pre_hook(lambda module, args: distances.append(module.batch_distance(args[0])))
                 for module in self.norms]
        try:
            for module in self.norms:
                module.train()
            loss = self.model(x, y)[1].float()
        finally:
            for hook in hooks:
                hook.remove()
            for module, name, buffer, value in saved:
                # PowerNorm replaces its buffers by new tensors in training: the originals come back, with their values
                buffer.copy_(value)
                setattr(module, name, buffer)
                module.eval()
        per_statistic = torch.stack([torch.stack([d[key] for key in self.statistics]) for d in distances]).mean(0)
        return torch.cat([loss.reshape(1), per_statistic])

    def named(self, split, means):
        """The eval event's keys for the means over a split's batches of what measure() returns:
        "<split>_loss_batch_stats", and on the val split "batch_stat_dist", {statistic: distance}."""
        if not self.norms:
            return {}
        named = {f"{split}_loss_batch_stats": means[0]}
        if split == "val":
            named["batch_stat_dist"] = dict(zip(self.statistics, means[1:]))
        return named

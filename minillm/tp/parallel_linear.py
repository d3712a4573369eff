"""Tensor-parallel linear layers (Megatron-LM, Shoeybi et al. 2019): one matrix split across N ranks.

A linear layer is y = x @ W.T with W: [out, in] (PyTorch's layout). It can be cut two ways:

    column-parallel  rank r holds W[r-th out/N rows, :]  and computes y[:, r-th out/N features]
                     from the whole x. No communication: each rank owns a slice of the output.
    row-parallel     rank r holds W[:, r-th in/N columns] and computes x_r @ W_r.T, a [n, out]
                     *partial sum* over its input features; y = sum over ranks of the partials,
                     which one all-reduce gives to every rank.

("column" and "row" name the cut of W.T, the [in, out] matrix of y = x @ W.T, as in the paper.)
A column-parallel layer followed by a row-parallel one needs no communication between them, since
the column layer's output slice is exactly the input slice the row layer wants: a transformer block
pays one all-reduce after attention and one after the MLP.

`shard_columns`, `shard_rows` and `row_parallel` are the two seams a learner rewrites: cutting a
matrix, and placing the all-reduce.
"""
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

AllReduce = Callable[[torch.Tensor], None]  # sums a tensor in place across the ranks


def _slice(size: int, rank: int, world: int, what: str) -> slice:
    if size % world:
        raise ValueError(f"{what} ({size}) cannot be split evenly across {world} ranks: "
                         f"use a world size that divides it")
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, {world}), got {rank}")
    part = size // world
    return slice(rank * part, (rank + 1) * part)


def shard_columns(weight: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Column-parallel cut. weight: [out, in] -> rank's [out / world, in]: output features
    rank * out/world .. (rank + 1) * out/world. A bias [out] is cut the same way (it is 1-d)."""
    return weight[_slice(weight.shape[0], rank, world, "output features")]


def shard_rows(weight: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Row-parallel cut. weight: [out, in] -> rank's [out, in / world]: input features
    rank * in/world .. (rank + 1) * in/world."""
    return weight[:, _slice(weight.shape[1], rank, world, "input features")]


def _layout_of(like: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """t stored the way `like` is: load_model keeps CPU weights column by column (prepare.column_major
    says why), and a shard should run as fast as the matrix it came from."""
    column_major = like.dim() == 2 and like.stride(0) == 1 and like.shape[1] > 1
    return t.t().contiguous().t() if column_major else t.contiguous()


def row_parallel(x_shard: torch.Tensor, weight_shard: torch.Tensor, all_reduce: AllReduce,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = sum_r x_r @ W_r.T (+ bias). x_shard: [n, in / world], this rank's input features;
    weight_shard: [out, in / world] -> y: [n, out], the same on every rank.
    The bias is added after the sum, once: added before it, it would count world times."""
    partial = F.linear(x_shard, weight_shard)  # [n, out]: this rank's share of the sum
    all_reduce(partial)  # in place: now the sum over every rank's share
    return partial if bias is None else partial + bias


class ColumnParallelLinear(nn.Module):
    """Rank `rank`'s slice of a linear layer's output features (no communication).

    A fused layer (q/k/v, or gate/up) is the concatenation of several matrices along the output
    dimension; `parts` gives their widths, and each is cut on its own, so rank r keeps the r-th
    slice of *each* (its q heads with their k and v heads; matching halves of gate and up), in the
    original order. Cutting the fused matrix as one would hand rank 0 all of q and rank 1 k and v.
    """

    def __init__(self, full: nn.Linear, rank: int, world: int, parts: Sequence[int] | None = None) -> None:
        super().__init__()
        parts = list(parts or [full.out_features])
        cut = lambda t: torch.cat([shard_columns(p, rank, world) for p in t.split(parts)])  # noqa: E731
        self.weight = nn.Parameter(_layout_of(full.weight, cut(full.weight.detach())),  # [sum(parts) / world, in]
                                   requires_grad=False)
        self.bias = None if full.bias is None else nn.Parameter(cut(full.bias.detach()), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [n, in] -> [n, out / world]"""
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """Rank `rank`'s slice of a linear layer's input features; the partial sums are all-reduced."""

    def __init__(self, full: nn.Linear, rank: int, world: int, all_reduce: AllReduce) -> None:
        super().__init__()
        self.weight = nn.Parameter(_layout_of(full.weight, shard_rows(full.weight.detach(), rank, world)),
                                   requires_grad=False)  # [out, in / world]
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach().clone(), requires_grad=False)
        self.all_reduce = all_reduce

    def forward(self, x_shard: torch.Tensor) -> torch.Tensor:
        """x_shard: [n, in / world] -> [n, out], the same on every rank"""
        return row_parallel(x_shard, self.weight, self.all_reduce, self.bias)

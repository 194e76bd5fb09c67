"""Every matmul weight of the model: y = x W^T + b,  x: [..., in] -> y: [..., out],  W: [out, in].

nn.Linear's math, shapes, names and checkpoints; two things change how W is laid out and multiplied, for
decoding on CPU, where each step multiplies one row per sequence by every weight of the model:
- W is stored column-major (W^T contiguous, [in, out] in memory): for a few rows MKL's x @ W^T is faster
  reading W^T row by row (a whole decode step 1.2x on the dev machine's AMD EPYC); training is as fast either way.
- For at most SPLIT_MAX_ROWS rows without autograd, MKL multiplies on one thread however many torch has.
  With S threads, W^T is viewed (no copy) as S column blocks [S, in, out / S] and one batched matmul
  computes the blocks in parallel:
      y[..., s * out/S : (s + 1) * out/S] = x @ W^T[:, s * out/S : (s + 1) * out/S]
  The same dot products: bit-identical to F.linear for llama_tiny's shapes (tested); MKL's kernels for very
  narrow blocks may round the last bit differently. On 2 threads: llama_tiny's 25 matmuls of a decode step
  alone 1.56x at 1 row, 1.43x at 8, 1.11x at 64, 1.03x at 128; a whole batch-1 decode step 1.08-1.15x.
"""
import torch
import torch.nn.functional as F
from torch import nn

SPLIT_MAX_ROWS = 64


@torch.compiler.assume_constant_result  # torch.compile reads it once per graph instead of breaking the graph
def _threads():
    return torch.get_num_threads()


class Linear(nn.Linear):
    def store_column_major(self):
        """Called once the weight is final (after tying): same values, W^T contiguous."""
        self.weight.data = self.weight.data.t().contiguous().t()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        splits = _threads()
        rows = x.numel() // self.in_features
        if (splits > 1 and rows <= SPLIT_MAX_ROWS and self.out_features % splits == 0 and x.device.type == "cpu"
                and not torch.is_grad_enabled() and self.weight.stride() == (1, self.out_features)):
            return split_matmul(x, self.weight, self.bias, splits)
        return F.linear(x, self.weight, self.bias)


def split_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, splits: int) -> torch.Tensor:
    """F.linear(x, weight, bias) as `splits` column blocks in one batched matmul; weight column-major."""
    out, inp = weight.shape
    width = out // splits
    # Views, one call each (a decode step makes 25 of these products; every call counts):
    # blocks [S, in, out/S] of the column-major weight, block s, row k, column j = W[s * width + j, k];
    # rows [S, n, in], the same n rows of x for every block (stride 0 over S).
    blocks = weight.as_strided((splits, inp, width), (width, out, 1))
    x = x.contiguous()
    rows = x.as_strided((splits, x.numel() // inp, inp), (0, inp, 1))
    if bias is None:
        y = torch.bmm(rows, blocks)
    else:
        y = torch.baddbmm(bias.view(splits, 1, width), rows, blocks)
    if y.shape[1] == 1:  # [S, 1, out/S] is already [out] in order
        return y.view(*x.shape[:-1], out)
    return y.transpose(0, 1).reshape(*x.shape[:-1], out)  # [S, n, out/S] -> [n, S, out/S] -> [..., out]

"""What petting adds to a vLLM server: a worker method that fingerprints the weights it holds.

Start the server with ``--worker-extension-cls petting_vllm.WeightsFingerprint`` and this
folder (``python/`` of the petting repository) on ``PYTHONPATH``; petting then calls
``petting_weights_fingerprint`` through ``/collective_rpc`` (``VLLM_SERVER_DEV_MODE=1``)
after every full-weight reload, and samples only when the server's weights are the
committed version's.

The fingerprint is the sum and the sum of squares of every weight value, in float64.
Both are unchanged by how vLLM lays out what it loads (q, k and v fused into one
projection, gate and up into another, the vocabulary padded with zero rows), so petting
computes the same two numbers from the checkpoint's safetensors files, each value cast to
the dtype the server holds. vLLM's CPU backend moves a linear layer's weight into a
packed kernel and leaves an empty parameter: its values are read back through the
layer's own kernel, applied to the identity matrix (each output is one weight times 1
plus zeros, so exact in any dtype).
"""

import torch

ROWS_PER_CALL = 256


class WeightsFingerprint:
    """Mixed into vLLM's worker class (``--worker-extension-cls``)."""

    def petting_weights_fingerprint(self) -> dict:
        state = {"sum": torch.zeros((), dtype=torch.float64), "squares": torch.zeros((), dtype=torch.float64)}
        count, dtypes, seen = 0, set(), set()

        def add(values):
            nonlocal count
            values = values.detach().to(device="cpu", dtype=torch.float64)
            state["sum"] += values.sum()
            state["squares"] += values.square().sum()
            count += values.numel()

        with torch.no_grad():
            for module in self.get_model().modules():
                for name, parameter in module.named_parameters(recurse=False):
                    if id(parameter) in seen:
                        continue
                    seen.add(id(parameter))
                    dtypes.add(str(parameter.dtype).removeprefix("torch."))
                    if parameter.numel() > 0:
                        add(parameter)
                    elif name == "weight" and hasattr(module, "cpu_linear"):
                        for block in _packed_weight_blocks(module, parameter.dtype):
                            add(block)
        return {
            "sum": state["sum"].item(),
            "sum_squares": state["squares"].item(),
            "values": count,
            "dtypes": sorted(dtypes),
        }


def _packed_weight_blocks(module, dtype):
    """The transposed weight of a CPU linear layer whose kernel holds it, block by block."""
    rows = module.input_size_per_partition
    for start in range(0, rows, ROWS_PER_CALL):
        identity = torch.eye(rows, dtype=dtype)[start : start + ROWS_PER_CALL]
        yield module.cpu_linear(identity, module.weight, None)

"""Exports a saved `NormSliceOp` to ONNX (opset 18, torch's dynamo exporter; the legacy exporter
fails on RMSNorm). Run by `node.verifier.zk.build` as a subprocess of Planet's own Python with
ezkl's virtualenv appended to `sys.path` (for `onnx` and `onnxscript`, which only that venv has;
appended, so Planet's own torch and numpy still win):

    python -m node.verifier.zk.export_onnx OP.pt OUT.onnx EXTRA_SITE_PACKAGES
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m node.verifier.zk.export_onnx OP.pt OUT.onnx SITE", file=sys.stderr)
        return 2
    op_path, out, site = argv
    sys.path.append(site)
    import torch

    from node.verifier.zk.circuit import NormSliceOp

    saved = torch.load(op_path, weights_only=True)
    op = NormSliceOp(saved["norm_weight"], saved["rows"], float(saved["eps"])).eval()
    example = torch.zeros(1, op.hidden_size) + 0.5
    torch.onnx.export(
        op,
        (example,),
        out,
        dynamo=True,
        opset_version=18,
        input_names=["x"],
        output_names=["y"],
        external_data=False,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

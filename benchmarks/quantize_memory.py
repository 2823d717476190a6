"""Peak memory of ONNX Runtime's dynamic int8 quantizer on GPT-2 small's step graph: its own ``quantize_dynamic``
against kiln's driver of the same quantizer (kiln.optimize.ort_dynamic), each in a fresh process, same exclusions.

    python benchmarks/quantize_memory.py [--excluded 24] [--workdir /tmp/quantize-memory]

Builds benchmarks/decoder_latency.py's random-weight GPT-2 small and exports its fp32 step graph once (kept in
``--workdir``), then prints each driver's peak resident memory (VmHWM), seconds and whether the two files are equal.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

_CHILD = r"""
import json, sys, time
from pathlib import Path
import onnx
from onnxruntime.quantization import QuantType, quantize_dynamic
from kiln.optimize.onnx_passes import quantize_dynamic_int8
from kiln.system.cpu import cpu_info, int8_scheme

driver, src, dst, count = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
layers = [n.name for n in onnx.load(str(src), load_external_data=False).graph.node if n.op_type in ("MatMul", "Gemm")]
excluded, scheme = layers[:count], int8_scheme(cpu_info())
def hwm():
    return next(int(l.split()[1]) // 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:"))
before, start = hwm(), time.perf_counter()
if driver == "kiln":
    quantize_dynamic_int8(src, dst, scheme, exclude=excluded)
else:
    quantize_dynamic(str(src), str(dst), per_channel=True, reduce_range=scheme.reduce_range,
                     weight_type=QuantType.QInt8 if scheme.weights_signed else QuantType.QUInt8,
                     nodes_to_exclude=[*excluded, *(f"{n}_MatMul" for n in excluded)],
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT, "MatMulConstBOnly": True})
print(json.dumps({"driver": driver, "peak_mib": hwm(), "peak_before_mib": before,
                  "seconds": round(time.perf_counter() - start, 1)}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--excluded", type=int, default=24, help="layers kept in fp32 (the search's first attempt)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/quantize-memory"))
    args = parser.parse_args()
    graph = args.workdir / "export" / "onnx-fp32" / "model.onnx"
    if not graph.is_file():
        sys.path.insert(0, str(HERE))
        sys.path.insert(0, str(HERE.parent))
        from decoder_latency import build_model

        from kiln.choices import ExportFormat
        from kiln.export.job import ExportConfig, run_export

        model = build_model(args.workdir / "model")
        run_export(ExportConfig(model=str(model), task="text-generation", format=ExportFormat.ONNX,
                                output=args.workdir / "export", overwrite=True))
    rows = []
    for driver in ("onnxruntime", "kiln"):
        out = args.workdir / f"{driver}.onnx"
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", _CHILD, driver, str(graph), str(out), str(args.excluded)],
                              check=True, capture_output=True, text=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]) | {"wall": round(time.perf_counter() - started)})
    same = (args.workdir / "onnxruntime.onnx").read_bytes() == (args.workdir / "kiln.onnx").read_bytes()
    for row in rows:
        print(f"{row['driver']:12s} peak {row['peak_mib']:5d} MiB in {row['seconds']} s "
              f"(peak before quantizing, reading the layer names: {row['peak_before_mib']} MiB)")
    print(f"fp32 graph {graph.stat().st_size / 2**20:.0f} MiB, {args.excluded} layers kept in fp32; "
          f"files identical: {same}")


if __name__ == "__main__":
    main()

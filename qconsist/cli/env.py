"""``qconsist env``: the environment fingerprint qconsist records, with warnings where it changes results."""

from __future__ import annotations


from qconsist.cli import options as opt
from qconsist.cli.app import print_json, stdout_console
from qconsist.cli.emulated import reexec_under


def _show(value: object) -> str:
    return "-" if value in (None, "", [], {}) else str(value)


def env(json_output: opt.Json = False, isa: opt.Isa = None) -> None:
    """Print the environment every run records (versions, providers, GPU, driver, CUDA/cuDNN, the instruction
    set that chooses onnxruntime's CPU kernels and the integer path it implies, numerics variables), what
    onnxruntime can load, and warnings where something is known to change results.

    Exit 0 (warnings do not change the exit code; they are listed, and `passed` is false under --json).
    """
    if isa is not None and reexec_under(isa, quiet=json_output):
        return
    from qconsist.environment import check_environment
    from qconsist.inference.session import onnxruntime_limits, provider_available

    provider_available("cuda")  # where there is one, load CUDA and cuDNN so their runtime versions are read
    report = check_environment(onnxruntime_limits())
    if json_output:
        print_json(report)
        return
    fp = report.fingerprint
    console = stdout_console()
    console.print(f"{'onnxruntime (module)':<21} {_show(report.onnxruntime)}  (loads up to opset {_show(report.newest_opset)}, IR {_show(report.newest_ir)})")
    console.print(f"{'providers':<21} {', '.join(fp['onnxruntime_providers'])}")
    for name, version in fp["packages"].items():
        locked = report.locked.get(name)
        note = "" if locked in (None, version) or version is None else f"  (uv.lock: {locked})"
        console.print(f"{name:<21} {_show(version)}{note}")
    console.print(f"{'python':<21} {fp['python']} ({fp['implementation']}), {fp['os']}, {fp['machine']}")
    console.print(f"{'cpu':<21} {fp['cpu']} ({fp['cpu_count']} cores)")
    isa = fp.get("cpu_isa") or {}
    where = f"emulated {isa['emulated']} under QEMU {isa.get('qemu') or ''}".rstrip() if isa.get("emulated") else "native"
    console.print(f"{'instruction set':<21} {isa.get('kernels')} ({where}; {isa.get('vendor')}; "
                  f"from {isa.get('source')}): {' '.join(isa.get('features') or []) or 'none of AVX/AVX2/AVX-512/AMX'}")
    console.print(f"{'integer path':<21} {isa.get('integer_path')}")
    console.print(f"{'float kernels':<21} {isa.get('float_kernels')}")
    for gpu in fp["gpus"] or [{}]:
        console.print(f"{'gpu':<21} {_show(gpu.get('name'))}  driver {_show(gpu.get('driver'))}  "
                      f"memory {_show(gpu.get('memory'))}  compute {_show(gpu.get('compute_capability'))}")
    cuda = fp["cuda"]
    console.print(f"{'cuda':<21} build {_show(cuda.get('ort_cuda'))}, runtime {_show(cuda.get('cudart_runtime'))}; "
                  f"cudnn build {_show(cuda.get('ort_cudnn'))}, runtime {_show(cuda.get('cudnn_runtime'))}")
    set_vars = {k: v for k, v in fp["env"].items() if v is not None}
    console.print(f"{'numerics variables':<21} {', '.join(f'{k}={v}' for k, v in set_vars.items()) or 'none set'}")
    for warning in report.warnings:
        console.print(f"warning: {warning}")

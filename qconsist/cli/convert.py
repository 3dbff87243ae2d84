"""``qconsist convert DEPLOY.prototxt MODEL.caffemodel -o OUT.onnx``: the pipeline's convert stage, alone."""

from __future__ import annotations

from pathlib import Path

import typer

from qconsist.cli import options as opt
from qconsist.cli.app import print_json, stdout_console
from qconsist.errors import EXIT_OK


def convert(
    prototxt: Path = typer.Argument(..., parser=opt.read_path, help="The Caffe network (deploy .prototxt)." + opt.PACKAGE_PATHS),
    caffemodel: Path = typer.Argument(..., parser=opt.read_path, help="Its weights (.caffemodel)."),
    output: opt.told(opt.Output, "The file to write: the ONNX model, written only once every check passed.") = ...,
    opset: int = typer.Option(17, "--opset", help="ai.onnx opset of the converted model (13-21)."),
    dynamic_batch: opt.told(opt.DynamicBatch, more="As [convert] dynamic_batch in a pipeline file.") = False,
    check: bool = typer.Option(True, "--check/--no-check", help="Compare the converted model with the numpy Caffe reference on a seeded input."),
    force: opt.Force = False,
    json_output: opt.Json = False,
) -> None:
    """Convert a Caffe model to ONNX with the pipeline's convert stage: caffe2onnx, qconsist's repairs,
    onnx.checker, onnxruntime, and the fidelity check against the numpy Caffe reference (its figure printed).

    Exit 0 converted; 2 error (unsupported layer, unreadable files, fidelity outside tolerance).
    """
    from qconsist.errors import OutputError
    from qconsist.stages.convert import ConvertOptions, convert_file
    from qconsist.store.hashing import hash_file

    from qconsist.store.outputs import check_output

    options = ConvertOptions(opset=opset, dynamic_batch=dynamic_batch, check=check)
    if output.exists() and not force:
        raise OutputError(f"{output} exists; choose another `output` or pass --force")
    check_output(output, [prototxt, caffemodel], force)
    result = convert_file(prototxt, caffemodel, output, options)
    hashes = hash_file(output)
    if json_output:
        print_json({"schema": "qconsist.convert/1", **result.to_json(), "md5": hashes.md5, "sha256": hashes.sha256,
                    "size": hashes.size, "passed": result.passed})
        raise typer.Exit(EXIT_OK)
    console = stdout_console()
    console.print(f"{output}: opset {result.opset}, IR {result.ir_version}, md5 {hashes.md5}, "
                  f"{len(result.repairs)} repair(s), {result.seconds:.2f} s")
    for line in result.repairs:
        console.print(f"  repair: {line}")
    if result.check is None:
        console.print("fidelity: not checked (--no-check)")
    else:
        c = result.check
        console.print(f"fidelity: greatest abs difference {c.max_abs:.3g} vs the numpy Caffe reference "
                      f"(relative to the output's peak {c.max_rel:.3g}; tolerance {c.tolerance:.3g}): "
                      f"{'passed' if c.passed else 'FAILED'} in {c.seconds:.2f} s")
    raise typer.Exit(EXIT_OK)

"""@local_jax: the XLA FFI headers and the Python interpreter of the installed jaxlib.

The extension must be compiled against the FFI headers of the jaxlib that
loads it (the FFI API version differs between jaxlib releases), so nothing is
downloaded: the rule asks the Python interpreter where its jaxlib keeps them,
`jax.ffi.include_dir()`, and links that directory in. The same interpreter
runs the py_test targets through a registered Python toolchain.

The interpreter is $HISPARSE_PYTHON when set (CI passes the virtualenv's
python with --repo_env), else the first python3 on PATH. Changing either
re-runs the rule; `bazel sync --configure` re-runs it after a jaxlib upgrade.
"""

_PROBE = "import sys, jax; print(sys.executable); print(jax.ffi.include_dir()); print(jax.__version__)"

_BUILD = """\
load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

package(default_visibility = ["//visibility:public"])

# jaxlib {version} at {include_dir}
cc_library(
    name = "ffi_headers",
    hdrs = glob(["include/xla/ffi/api/*.h"]),
    includes = ["include"],
)

py_runtime(
    name = "python3",
    interpreter_path = "{python}",
    python_version = "PY3",
)

py_runtime_pair(
    name = "python_runtimes",
    py3_runtime = ":python3",
)

toolchain(
    name = "python_toolchain",
    toolchain = ":python_runtimes",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)
"""

def _local_jax_impl(rctx):
    python = rctx.os.environ.get("HISPARSE_PYTHON", "")
    if not python:
        found = rctx.which("python3")
        if found == None:
            fail("local_jax: no python3 on PATH; set --repo_env=HISPARSE_PYTHON=/path/to/python")
        python = str(found)
    probe = rctx.execute([python, "-c", _PROBE])
    if probe.return_code != 0:
        fail(("local_jax: `{} -c 'import jax'` failed; install jax into that interpreter or " +
              "point --repo_env=HISPARSE_PYTHON at one that has it:\n{}").format(python, probe.stderr))
    executable, include_dir, version = probe.stdout.strip().splitlines()
    if not rctx.path(include_dir + "/xla/ffi/api/ffi.h").exists:
        fail("local_jax: jaxlib {} has no XLA FFI headers under {}".format(version, include_dir))
    rctx.symlink(include_dir, "include")
    rctx.file("WORKSPACE", 'workspace(name = "{}")\n'.format(rctx.name))
    rctx.file("BUILD", _BUILD.format(python = executable, include_dir = include_dir, version = version))

local_jax = repository_rule(
    implementation = _local_jax_impl,
    configure = True,
    environ = ["HISPARSE_PYTHON", "PATH"],
    local = True,
)

"""The Python package installs with pip, offline, and carries its library."""

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import PYTHON_DIR, REPO, describe, run_launch


def _venv_and_pip_available():
    if importlib.util.find_spec("venv") is None:
        return False
    return subprocess.run([sys.executable, "-m", "pip", "--version"],
                          capture_output=True).returncode == 0


def _offline_env():
    """This environment without what would point Python or pip elsewhere,
    and pip kept off every index (no proxy that could work: a download
    attempt fails fast)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "UNISUM_LIBRARY", "PYTHONHOME", "VIRTUAL_ENV")
           and not k.startswith("PIP_")}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONWARNINGS="ignore",
               http_proxy="http://127.0.0.1:9", https_proxy="http://127.0.0.1:9")
    return env


@pytest.mark.skipif(not _venv_and_pip_available(), reason="venv or pip is not installed")
def test_pip_install_into_fresh_venv(tmp_path):
    """`pip install --no-deps --no-build-isolation ./python` into a fresh
    `venv --system-site-packages` works offline (no index), and the installed
    package, run from outside the repository with PYTHONPATH and
    UNISUM_LIBRARY unset, imports unisum.torch, loads the libunisum.so it
    carries in the venv's site-packages, and runs a real 1-worker job.

    The source tree is copied first (without build artifacts), so that pip's
    in-tree build (python/build/, *.egg-info) does not write into the
    checkout; what pip sees is exactly ./python.  The venv's pip is the
    system's (`--without-pip`: ensurepip's copy cost 3.5 CPU-s a venv), run
    by the venv's python, so it installs into the venv."""
    venv = tmp_path / "venv"
    src = tmp_path / "src" / "python"
    shutil.copytree(PYTHON_DIR, src, ignore=shutil.ignore_patterns(
        "build", "*.egg-info", "__pycache__", "dist"))
    assert (src / "unisum" / "libunisum.so").exists(), \
        "python/unisum/libunisum.so is missing: the build copies it there"

    env = _offline_env()

    def run(cmd, timeout=180):
        p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env,
                           cwd=tmp_path, timeout=timeout)
        assert p.returncode == 0, "%s failed: %s" % (cmd, describe(p.returncode, p.stdout, p.stderr))
        return p.stdout

    run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv])
    vpy = venv / "bin" / "python"
    run([vpy, "-m", "pip", "install", "--no-deps", "--no-build-isolation", src])

    site = run([vpy, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip()
    site = os.path.realpath(site)
    assert site.startswith(os.path.realpath(str(venv)))
    out = run([vpy, "-c", textwrap.dedent("""\
        import os, unisum, unisum.torch, unisum._capi
        print(os.path.realpath(unisum.__file__))
        print(os.path.realpath(unisum._capi.lib._name))
        try:
            unisum.torch.rank()
        except unisum.UnisumError as e:
            print("not initialized:", e)
        """)])
    pkg_file, lib_name, not_init = out.splitlines()[:3]
    assert pkg_file == os.path.join(site, "unisum", "__init__.py"), out
    assert lib_name == os.path.join(site, "unisum", "libunisum.so"), out
    assert os.path.isfile(lib_name)
    assert not_init.startswith("not initialized:") and "init()" in not_init, out

    # A real job with the installed package: the launcher's workers run the
    # venv's python from outside the repository, PYTHONPATH unset.
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""\
        import os, torch, unisum, unisum.torch as us
        torch.set_num_threads(1)
        assert os.path.realpath(unisum._capi.lib._name).startswith(%r)
        us.init()
        out = us.push_pull(torch.arange(4, dtype=torch.float32), average=False, name="t")
        print("result", out.tolist(), us.size())
        us.shutdown()
        """ % site))
    rc, out, err = run_launch(1, 1, str(script), timeout=60, env=env, cwd=str(tmp_path),
                              python=str(vpy))
    assert rc == 0, describe(rc, out, err)
    assert "[worker 0] result [0.0, 1.0, 2.0, 3.0] 1" in out.splitlines(), out


@pytest.mark.skipif(not _venv_and_pip_available(), reason="venv or pip is not installed")
def test_wheel_carries_the_library_and_the_cli(tmp_path):
    """`make wheel`'s command builds a wheel tagged for this platform (it
    carries native code) that holds libunisum.so and the unisum CLI; it
    installs offline into a `venv --system-site-packages`, puts `unisum` on
    the venv's PATH (a console script), and that command runs a job whose
    worker imports the installed package: versions agree with VERSION."""
    version = open(os.path.join(REPO, "VERSION")).read().strip()
    src = tmp_path / "src" / "python"
    shutil.copytree(PYTHON_DIR, src, ignore=shutil.ignore_patterns(
        "build", "*.egg-info", "__pycache__", "dist"))
    assert (src / "unisum" / "bin" / "unisum").exists(), \
        "python/unisum/bin/unisum is missing: the build copies the CLI there"
    env = _offline_env()

    def run(cmd, cwd=tmp_path, timeout=180):
        p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env,
                           cwd=cwd, timeout=timeout)
        assert p.returncode == 0, "%s failed: %s" % (cmd, describe(p.returncode, p.stdout, p.stderr))
        return p.stdout

    dist = tmp_path / "dist"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "-q", "-w", dist, "."], cwd=src)
    wheels = [w.name for w in dist.iterdir()]
    assert len(wheels) == 1 and wheels[0].startswith("unisum-%s-cp" % version) \
        and wheels[0].endswith("-linux_x86_64.whl"), wheels
    import zipfile
    names = zipfile.ZipFile(dist / wheels[0]).namelist()
    assert "unisum/libunisum.so" in names and "unisum/bin/unisum" in names, names

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv])
    run([venv / "bin" / "python", "-m", "pip", "install", "--no-deps", dist / wheels[0]])
    out = run([venv / "bin" / "unisum", "--version"])
    assert out.startswith("unisum %s (wire protocol " % version), out
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""\
        import torch, unisum, unisum.torch as us
        torch.set_num_threads(1)
        us.init()
        out = us.push_pull(torch.ones(3), average=False, name="t")
        print("version", unisum.__version__, "result", out.tolist())
        us.shutdown()
        """))
    out = run([venv / "bin" / "unisum", "launch", "-w", "1", "-s", "1", "--",
               venv / "bin" / "python", script], timeout=120)
    assert "[worker 0] version %s result [1.0, 1.0, 1.0]" % version in out.splitlines(), out

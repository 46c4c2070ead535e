"""Build hook: compile libflamia.so with CMake and ship it inside the flamia package.

    pip install --no-build-isolation .

Environment:
  FLAMIA_CMAKE_ARGS   extra arguments for the CMake configure step (space separated)
  FLAMIA_BUILD_DIR    build folder to use (default: <setuptools build_temp>/cmake)
  FLAMIA_SKIP_CMAKE=1 package only the Python code (the library is then found through
                      FLAMIA_LIBRARY or ./build*/libflamia.so at run time)
  CMAKE_BUILD_PARALLEL_LEVEL  parallel compile jobs (default: all cores)
"""

import os
import shlex
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parent
LIB_NAME = "libflamia.so"


def _run(cmd, **kw) -> None:
    print("+ " + " ".join(shlex.quote(str(c)) for c in cmd), flush=True)
    subprocess.check_call([str(c) for c in cmd], **kw)


class BuildWithCMake(build_py):
    """build_py that first builds the shared library and copies it into the package."""

    def run(self) -> None:
        super().run()
        if os.environ.get("FLAMIA_SKIP_CMAKE") == "1":
            print("flamia: FLAMIA_SKIP_CMAKE=1, not building libflamia.so", flush=True)
            return
        lib = self._cmake_build()
        dest = Path(self.build_lib) / "flamia" / LIB_NAME
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(lib, dest)
        print(f"flamia: packaged {lib} -> {dest}", flush=True)

    def _cmake_build(self) -> Path:
        cmake = shutil.which("cmake")
        if cmake is None:
            raise RuntimeError("flamia: cmake not found on PATH (needed to build libflamia.so)")
        build_temp = Path(self.get_finalized_command("build").build_temp)
        build_dir = Path(os.environ.get("FLAMIA_BUILD_DIR", build_temp / "cmake")).resolve()
        build_dir.mkdir(parents=True, exist_ok=True)
        cfg = [cmake, "-S", ROOT, "-B", build_dir,
               "-DCMAKE_BUILD_TYPE=Release",
               # The package needs only the library; the C++ test suites need GTest.
               "-DFLAMIA_BUILD_TESTS=OFF"]
        # Reuse an existing build folder's generator; otherwise prefer Ninja when present.
        if not (build_dir / "CMakeCache.txt").exists() and shutil.which("ninja"):
            cfg += ["-G", "Ninja"]
        cfg += shlex.split(os.environ.get("FLAMIA_CMAKE_ARGS", ""))
        _run(cfg)
        env = dict(os.environ)
        env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
        _run([cmake, "--build", build_dir, "--target", "flamia"], env=env)
        hits = sorted(build_dir.rglob(LIB_NAME))
        if not hits:
            raise RuntimeError(f"flamia: CMake finished but no {LIB_NAME} under {build_dir}")
        return hits[0]


class BinaryDistribution(Distribution):
    """The wheel carries a native library, so it must get a platform tag."""

    def has_ext_modules(self) -> bool:
        return True


if __name__ == "__main__":
    setup(cmdclass={"build_py": BuildWithCMake}, distclass=BinaryDistribution)

# Spack recipe for ddl, kept in ddl's own repository (docs/install.md, section "Spack"):
#   spack repo add /path/to/ddl/spack/spack_repo/ddl
#   spack env create ddl && spack env activate ddl
#   spack develop --path /path/to/ddl ddl@=0.1.0 && spack add ddl@0.1.0 +python && spack install
# tests/integration/test_spack_recipe.py checks, without Spack, that every variant and every CMake
# variable this recipe passes exists in ddl's CMake files.
import os

from spack.package import *

try:  # Spack >= 1.0: the build systems live in the builtin package repository
    from spack_repo.builtin.build_systems.cmake import CMakePackage
except ImportError:  # Spack 0.23 exports them from spack.package
    pass

# The Gloo commit cmake/Dependencies.cmake pins (Spack's gloo@2023-01-17): the first upstream commit
# that builds on Linux 6 headers.
GLOO_COMMIT = "10909297fedab0a680799211a299203e53515032"


class Ddl(CMakePackage):
    """Launcher and collective runtime for distributed deep-learning training on supercomputers:
    `ddl run` (one worker per GPU under Slurm, PBS or locally, with the environment PyTorch DDP,
    Lightning and Horovod-style scripts expect), libddl (allreduce and friends over Gloo and NCCL,
    a C and C++ API), and the Python package ddl (ddl.torch, ddl.tensorflow, ddl.keras: Horovod's
    API over libddl)."""

    # ddl has no published release archive yet: Spack builds it from a checkout with `spack develop`
    # (see the header above). Add url/git and checksummed versions here once it has one.
    version("0.1.0")  # project(ddl VERSION ...) in CMakeLists.txt

    variant("cuda", default=False, description="NCCL backend for CUDA tensors (DDL_WITH_NCCL)")
    variant("pmix", default=False, description="Bootstrap under mpirun / srun --mpi=pmix (DDL_WITH_PMIX)")
    variant("python", default=True,
            description="Install the Python package ddl (ddl.torch, ddl.tensorflow, ddl.keras) into "
                        "Python's site-packages (DDL_INSTALL_PYTHON)")

    conflicts("platform=darwin", msg="ddl runs on Linux (epoll, /proc, Linux schedulers)")
    conflicts("platform=windows", msg="ddl runs on Linux (epoll, /proc, Linux schedulers)")

    depends_on("cxx", type="build")  # C++20
    depends_on("c", type="build")  # the pinned Gloo's own CMake project enables C as well
    depends_on("cmake@3.25:", type="build")
    # What cmake/Dependencies.cmake looks up first; the versions are those built and tested (Debian 12's).
    depends_on("cli11@2.1:", type="build")  # header-only
    depends_on("fmt@9.1:9")
    depends_on("nlohmann-json@3.11:")
    # Boost.Process (header-only, through <boost/process.hpp>: its v1 API, which 1.88 replaced) and
    # Boost.Filesystem, which it links.
    depends_on("boost@1.74:1.87 +filesystem")
    # Gloo: the pinned commit, built into libddl (position-independent, hidden), as a pip install
    # does. Spack's own gloo package builds upstream's default, a static library with no request for
    # position-independent code, which a shared libddl cannot link where the compiler does not make
    # such code by default. Spack fetches this resource (mirrorable): the build downloads nothing.
    resource(name="gloo", git="https://github.com/facebookincubator/gloo.git", commit=GLOO_COMMIT,
             destination="spack-resources", placement="gloo")

    with when("+cuda"):
        depends_on("cuda")
        depends_on("nccl")
    with when("+pmix"):
        depends_on("pmix")
        depends_on("pkgconfig", type="build")  # rendezvous/CMakeLists.txt: pkg_check_modules(pmix)
    with when("+python"):
        # Pure Python over libddl's C ABI (ctypes): no build against any framework. PyTorch and
        # TensorFlow are deliberately not dependencies: one ddl serves every torch a site or a user
        # has (a module, a conda env, a venv), and Spack would otherwise build its own torch.
        extends("python")
        depends_on("python@3.8:", type=("build", "run"))

    def cmake_args(self):
        spec = self.spec
        args = [
            self.define("DDL_WITH_NCCL", spec.satisfies("+cuda")),
            self.define("DDL_WITH_PMIX", spec.satisfies("+pmix")),
            self.define("DDL_INSTALL_PYTHON", spec.satisfies("+python")),
            # Spack writes its own module files (Lmod or Tcl) for what it installs.
            self.define("DDL_INSTALL_MODULEFILE", False),
            # The tests need Slurm, PyTorch and more than a Spack build has; benchmarks and examples
            # are left out as in a pip install.
            self.define("BUILD_TESTING", False),
            self.define("DDL_BUILD_EXTRAS", False),
            # Gloo: the pinned commit built into libddl, never a system copy.
            self.define("CMAKE_DISABLE_FIND_PACKAGE_Gloo", True),
        ]
        gloo = join_path(self.stage.source_path, "spack-resources", "gloo")
        if os.path.isdir(gloo):
            # The resource Spack fetched: the build downloads nothing.
            args.append(self.define("FETCHCONTENT_SOURCE_DIR_GLOO", gloo))
            args.append(self.define("FETCHCONTENT_FULLY_DISCONNECTED", True))
        # else: a `spack develop` build, whose stage holds no resources (a known Spack limitation):
        # cmake/Dependencies.cmake then downloads the same commit itself (docs/install.md, "Spack").
        if spec.satisfies("+cuda"):
            args.append(self.define("CUDAToolkit_ROOT", spec["cuda"].prefix))
        if spec.satisfies("+python"):
            # Python's own site-packages under ddl's prefix, which Spack's modules and views put on
            # PYTHONPATH; the package finds PREFIX/lib/libddl.so.0 from there.
            args.append(self.define("DDL_INSTALL_PYTHONDIR", spec["python"].package.purelib))
        return args

"""The Spack recipe in spack/spack_repo/ddl checked without Spack. Read as source (Python's ast), as
Spack's importer meets it:
  - one package class, named as Spack names it after its folder, a CMakePackage, importing only Spack;
  - version, url and git fields that agree (no archive yet: no url, no checksums, `spack develop`);
  - every depends_on a well-formed spec of a lower-case package name, with dependency types Spack
    knows, and every condition naming a declared variant.
Then loaded with a small stand-in for the names it imports from Spack (only to read it), and
  - its version is the project's (CMakeLists.txt, pyproject.toml);
  - every variant changes the CMake arguments, and every -D it passes is a cache variable or option
    this project defines, or a CMake variable the project really consults;
  - it depends on what the CMake files look up (and Gloo is the commit Dependencies.cmake pins);
  - CMake configures this checkout with the arguments of each variant combination the machine
    can build, uses every variable it is given, installs the Python package where Spack's Python
    looks for it, and writes no module file (Spack writes its own)."""
import ast
import contextlib
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import types
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RECIPE = os.path.join(ROOT, "spack", "spack_repo", "ddl", "packages", "ddl", "package.py")
PURELIB = "lib/python3.11/site-packages"  # what Spack's python package answers for `purelib`


def read(rel):
    with open(os.path.join(ROOT, rel)) as f:
        return f.read()


def project_cmake():
    """Every CMake file of the project (not the build trees), path -> text."""
    texts = {}
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(("build", ".")) and d != "spack"]
        for name in files:
            if name == "CMakeLists.txt" or name.endswith(".cmake"):
                path = os.path.join(top, name)
                with open(path) as f:
                    texts[os.path.relpath(path, ROOT)] = f.read()
    return texts


def cache_variables(texts):
    """Names the project declares as options or cache variables."""
    names = set()
    for text in texts.values():
        names.update(re.findall(r"\boption\(\s*(\w+)", text))
        names.update(re.findall(r"\bset\(\s*(\w+)\s+[^)]*?\bCACHE\b", text, re.DOTALL))
    return names


class Recorder:
    """Stands in for spack.package: records the directives of the recipe's class body."""

    def __init__(self):
        self.directives = []
        self.conditions = []

    def directive(self, kind):
        def record(*args, **kwargs):
            self.directives.append((kind, args, kwargs, " ".join(self.conditions)))
        return record

    @contextlib.contextmanager
    def when(self, condition):
        self.conditions.append(condition)
        yield
        self.conditions.pop()


class FakeSpec:
    def __init__(self, variants):
        self.variants = variants  # name -> bool

    def satisfies(self, constraint):
        m = re.fullmatch(r"([+~])(\w+)", constraint)
        assert m, f"the stand-in knows only +variant / ~variant, not {constraint!r}"
        return self.variants[m.group(2)] == (m.group(1) == "+")

    def __getitem__(self, name):
        return types.SimpleNamespace(prefix=f"/spack/opt/{name}",
                                     package=types.SimpleNamespace(purelib=PURELIB))


def define(name, value):
    """Spack's CMakePackage.define: booleans become BOOL ON/OFF, everything else a STRING."""
    if isinstance(value, bool):
        return f"-D{name}:BOOL={'ON' if value else 'OFF'}"
    return f"-D{name}:STRING={value}"


def load_recipe():
    recorder = Recorder()

    class CMakePackage:
        def __init__(self, spec, source_path):
            self.spec = spec
            self.stage = types.SimpleNamespace(source_path=source_path)

        def define(self, name, value):
            return define(name, value)

    package = types.ModuleType("spack.package")
    for kind in ("version", "variant", "depends_on", "conflicts", "resource", "extends", "maintainers", "license"):
        setattr(package, kind, recorder.directive(kind))
    package.when = recorder.when
    package.join_path = os.path.join
    package.__all__ = [n for n in vars(package) if not n.startswith("_")]
    build_systems = types.ModuleType("spack_repo.builtin.build_systems.cmake")
    build_systems.CMakePackage = CMakePackage
    stubs = {"spack": types.ModuleType("spack"), "spack.package": package, "spack_repo": types.ModuleType("spack_repo"),
             "spack_repo.builtin": types.ModuleType("spack_repo.builtin"),
             "spack_repo.builtin.build_systems": types.ModuleType("spack_repo.builtin.build_systems"),
             "spack_repo.builtin.build_systems.cmake": build_systems}
    saved = {name: sys.modules.get(name) for name in stubs}
    sys.modules.update(stubs)
    try:
        module = types.ModuleType("ddl_spack_recipe")
        module.__file__ = RECIPE
        with open(RECIPE) as f:
            exec(compile(f.read(), RECIPE, "exec"), module.__dict__)
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
    return module, recorder.directives


def parse_defines(args):
    """{NAME: VALUE} from -DNAME:TYPE=VALUE arguments."""
    defines = {}
    for arg in args:
        m = re.fullmatch(r"-D(\w+)(?::\w+)?=(.*)", arg)
        assert m, f"not a -D argument: {arg!r}"
        defines[m.group(1)] = m.group(2)
    return defines


# A dependency spec as the recipe may write it: name, optional version range, optional variants.
DEPENDENCY_SPEC = re.compile(r"(?P<name>[a-z0-9][a-z0-9-]*)(@[0-9][\w.:,]*)?(\s*[+~][a-z0-9_-]+)*")
CONDITION = re.compile(r"(?P<sign>[+~])(?P<variant>\w+)|platform=\w+")
DEPENDENCY_TYPES = {"build", "link", "run", "test"}


def literal(node):
    """The value of a constant expression (strings, numbers, booleans, tuples of them)."""
    return ast.literal_eval(node)


class RecipeSource(unittest.TestCase):
    """What the recipe's source says, read without executing it."""

    @classmethod
    def setUpClass(cls):
        with open(RECIPE) as f:
            cls.tree = ast.parse(f.read(), RECIPE)
        classes = [node for node in cls.tree.body if isinstance(node, ast.ClassDef)]
        assert len(classes) == 1, [c.name for c in classes]
        cls.package = classes[0]

    def calls(self, name):
        """(call, condition) for each `name(...)` in the class body, the condition of an enclosing
        `with when(...)` block ("" outside one)."""
        found = []

        def visit(statements, condition):
            for statement in statements:
                if isinstance(statement, ast.With):
                    (item,) = statement.items
                    self.assertEqual(item.context_expr.func.id, "when")
                    visit(statement.body, literal(item.context_expr.args[0]))
                elif isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call) \
                        and getattr(statement.value.func, "id", None) == name:
                    found.append((statement.value, condition))
        visit(self.package.body, "")
        return found

    def attributes(self):
        return {target.id: literal(node.value) for node in self.package.body if isinstance(node, ast.Assign)
                for target in node.targets if isinstance(target, ast.Name) and target.id.islower()}

    def test_one_cmake_package_named_after_its_folder_importing_only_spack(self):
        folder = os.path.basename(os.path.dirname(RECIPE))
        # Spack's class name for a package: each dash-separated word capitalized, joined.
        self.assertEqual(self.package.name, "".join(word.capitalize() for word in folder.split("-")))
        self.assertEqual([base.id for base in self.package.bases], ["CMakePackage"])
        imported = set()
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                imported.add(node.module)
        self.assertEqual({name for name in imported if name.split(".")[0] not in ("spack", "spack_repo")}, {"os"})
        self.assertTrue(ast.get_docstring(self.package))

    def test_versions_and_where_they_come_from_agree(self):
        attributes = self.attributes()
        versions = [(literal(call.args[0]), {kw.arg: literal(kw.value) for kw in call.keywords}) for call, _ in self.calls("version")]
        names = [name for name, _ in versions]
        self.assertTrue(names)
        self.assertEqual(len(names), len(set(names)), names)
        for name, fields in versions:
            self.assertRegex(name, r"^\d+(\.\d+)*$")
            if "sha256" in fields:
                self.assertRegex(fields["sha256"], r"^[0-9a-f]{64}$", name)
                self.assertIn("url", attributes, f"{name} has a checksum but the recipe no url to check it against")
            if "commit" in fields:
                self.assertRegex(fields["commit"], r"^[0-9a-f]{40}$", name)
            if {"commit", "tag", "branch"} & fields.keys():
                self.assertIn("git", attributes, f"{name} names a git revision but the recipe no git repository")
            if "url" in attributes and "git" not in attributes:
                self.assertIn("sha256", fields, f"{name}: an archive version needs its checksum")
            if "git" in attributes and "url" not in attributes:
                self.assertTrue({"commit", "tag", "branch"} & fields.keys(), f"{name}: a git version needs its revision")
        for field in ("url", "git", "homepage"):
            if field in attributes:
                self.assertRegex(attributes[field], r"^https://", field)
        if "url" in attributes:  # Spack finds other versions by replacing this one in the url
            self.assertTrue(any(name in attributes["url"] for name in names), attributes["url"])
        if not {"url", "git"} & attributes.keys():
            # Nothing to fetch ddl from: it is built from a checkout, which docs/install.md shows.
            self.assertTrue(all(not fields for _, fields in versions), versions)
            self.assertIn(f"spack develop --path ~/ddl ddl@={names[0]}", read("docs/install.md"))

    def test_dependency_specs_are_well_formed(self):
        variants = {literal(call.args[0]) for call, _ in self.calls("variant")}
        dependencies = set()
        for call, condition in self.calls("depends_on") + self.calls("extends"):
            spec = literal(call.args[0])
            m = DEPENDENCY_SPEC.fullmatch(spec)
            self.assertTrue(m, f"not a dependency spec the recipe should write: {spec!r}")
            keywords = {kw.arg: literal(kw.value) for kw in call.keywords}
            kinds = keywords.get("type", ("build", "link"))
            kinds = {kinds} if isinstance(kinds, str) else set(kinds)
            self.assertLessEqual(kinds, DEPENDENCY_TYPES, spec)
            when = " ".join(filter(None, (condition, keywords.get("when", ""))))
            for term in when.split():
                m2 = CONDITION.fullmatch(term)
                self.assertTrue(m2, f"{spec}: condition {term!r}")
                if m2.group("variant"):
                    self.assertIn(m2.group("variant"), variants, f"{spec}: condition on an undeclared variant")
            if call.func.id == "depends_on":  # extends("python") + depends_on("python@3.8:") is the idiom
                key = (m.group("name"), when)
                self.assertNotIn(key, dependencies, f"{spec} declared twice")
                dependencies.add(key)
        for call, condition in self.calls("variant"):
            keywords = {kw.arg: literal(kw.value) for kw in call.keywords}
            self.assertIsInstance(keywords.get("default"), bool, literal(call.args[0]))
            self.assertTrue(keywords.get("description"), literal(call.args[0]))
            self.assertRegex(literal(call.args[0]), r"^[a-z][a-z0-9_]*$")


class SpackRecipe(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.module, cls.directives = load_recipe()
        cls.cmake = project_cmake()
        cls.cache = cache_variables(cls.cmake)
        cls.variants = {args[0]: kwargs.get("default") for kind, args, kwargs, _ in cls.directives if kind == "variant"}

    def of_kind(self, kind):
        return [(args, kwargs, when) for k, args, kwargs, when in self.directives if k == kind]

    def cmake_args(self, variants, source_path="/nonexistent/spack-src"):
        pkg = self.module.Ddl(FakeSpec(variants), source_path)
        return pkg.cmake_args()

    def combinations(self):
        names = sorted(self.variants)
        for values in itertools.product((False, True), repeat=len(names)):
            yield dict(zip(names, values))

    def test_it_is_a_cmake_package_with_the_projects_version(self):
        self.assertEqual(self.module.Ddl.__bases__[0].__name__, "CMakePackage")
        project = re.search(r"project\(ddl VERSION (\S+)", read("CMakeLists.txt")).group(1)
        pyproject = re.search(r'^version = "(.*)"', read("pyproject.toml"), re.MULTILINE).group(1)
        versions = [args[0] for args, _, _ in self.of_kind("version")]
        self.assertEqual(versions, [project])
        self.assertEqual(pyproject, project)

    def test_variants_are_cuda_pmix_python(self):
        self.assertEqual(self.variants, {"cuda": False, "pmix": False, "python": True})

    def test_every_variant_changes_a_project_cache_variable(self):
        defaults = parse_defines(self.cmake_args(dict(self.variants)))
        for name, default in self.variants.items():
            toggled = parse_defines(self.cmake_args(dict(self.variants, **{name: not default})))
            changed = {k for k in defaults.keys() | toggled.keys() if defaults.get(k) != toggled.get(k)}
            project_owned = changed & self.cache
            self.assertTrue(project_owned, f"variant {name} changes no option of the project: {changed}")

    def test_every_define_is_an_option_of_the_project_or_a_variable_it_consults(self):
        # CMake's own variables the recipe passes, each with where the project makes it count.
        deps = self.cmake["cmake/Dependencies.cmake"]
        consulted = {
            "BUILD_TESTING": "include(CTest)" in read("CMakeLists.txt"),
            "FETCHCONTENT_FULLY_DISCONNECTED": "include(FetchContent)" in deps,
            # ddl_find_or_fetch(Gloo ...): find_package(Gloo), then FetchContent_Declare(gloo ...)
            "CMAKE_DISABLE_FIND_PACKAGE_Gloo": re.search(r"ddl_find_or_fetch\(Gloo\b", deps) is not None
                                               and "find_package(${package} QUIET)" in deps,
            "FETCHCONTENT_SOURCE_DIR_GLOO": "string(TOLOWER ${package} dep)" in deps
                                            and "FetchContent_Declare(${dep}" in deps,
            "CUDAToolkit_ROOT": "find_package(CUDAToolkit" in self.cmake["runtime/CMakeLists.txt"],
        }
        with tempfile.TemporaryDirectory() as stage:
            os.makedirs(os.path.join(stage, "spack-resources", "gloo"))  # the resource, staged
            for variants in self.combinations():
                for source in ("/nonexistent/spack-src", stage):
                    for name in parse_defines(self.cmake_args(variants, source)):
                        self.assertTrue(name in self.cache or consulted.get(name), f"{name} ({variants})")

    def test_dependencies_follow_what_cmake_looks_up(self):
        depends = {re.match(r"[\w-]+", args[0]).group(0): (args[0], when) for args, _, when in self.of_kind("depends_on")}
        minimum = re.search(r"cmake_minimum_required\(VERSION ([\d.]+)\)", read("CMakeLists.txt")).group(1)
        self.assertEqual(depends["cmake"][0], f"cmake@{minimum}:")
        deps = self.cmake["cmake/Dependencies.cmake"]
        for cmake_name, spack_name in (("fmt", "fmt"), ("CLI11", "cli11"), ("nlohmann_json", "nlohmann-json")):
            self.assertIn(f"ddl_find_or_fetch({cmake_name} ", deps)
            self.assertIn(spack_name, depends)
        boost = re.search(r"find_package\(Boost ([\d.]+) QUIET COMPONENTS (\w+)\)", deps)
        self.assertTrue(depends["boost"][0].startswith(f"boost@{boost.group(1)}:"), depends["boost"])
        self.assertIn(f"+{boost.group(2)}", depends["boost"][0])
        self.assertEqual(depends["cuda"][1], "+cuda")
        self.assertEqual(depends["nccl"][1], "+cuda")
        self.assertIn("pkg_check_modules", self.cmake["rendezvous/CMakeLists.txt"])
        self.assertEqual(depends["pmix"][1], "+pmix")
        self.assertEqual(depends["pkgconfig"][1], "+pmix")
        self.assertEqual([when for _, _, when in self.of_kind("extends")], ["+python"])
        # No framework: ddl.torch is pure Python over libddl's C ABI, for whichever torch the user has.
        self.assertFalse({"py-torch", "py-tensorflow"} & depends.keys())
        # Gloo: the very commit cmake/Dependencies.cmake pins.
        pinned = re.search(r"gloo\.git@([0-9a-f]{40})", deps).group(1)
        (args, kwargs, _), = self.of_kind("resource")
        self.assertEqual((kwargs["name"], kwargs["commit"]), ("gloo", pinned))

    def configure(self, variants, gloo_source=None):
        """Runs CMake on this checkout with the recipe's arguments (and what Spack's CMakePackage adds
        itself that matters here); returns (output, build folder)."""
        build = tempfile.mkdtemp(prefix="ddl-spack-configure-")
        self.addCleanup(shutil.rmtree, build, True)
        stage = os.path.join(build, "stage")
        if gloo_source:
            os.makedirs(os.path.join(stage, "spack-resources"))
            os.symlink(gloo_source, os.path.join(stage, "spack-resources", "gloo"))
        args = self.cmake_args(variants, stage)
        if not gloo_source:  # the pinned Gloo's source is not here: this machine's Gloo instead
            args = [a for a in args if not a.startswith("-DCMAKE_DISABLE_FIND_PACKAGE_Gloo")]
        if variants["cuda"]:  # this machine's CUDA, not the stand-in's prefix
            args = [a for a in args if not a.startswith("-DCUDAToolkit_ROOT")] + ["-DCUDAToolkit_ROOT=/usr/local/cuda"]
        result = subprocess.run(["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_INSTALL_PREFIX={build}/prefix",
                                 *args], capture_output=True, text=True, timeout=600)
        output = result.stdout + result.stderr
        self.assertEqual(result.returncode, 0, output[-5000:])
        unused = re.search(r"Manually-specified variables were not used by the project:\s+([\w\s]*)", output)
        unused = set(unused.group(1).split()) if unused else set()
        # A safeguard CMake reads only when something would be downloaded: here nothing is.
        unused.discard("FETCHCONTENT_FULLY_DISCONNECTED")
        self.assertEqual(unused, set(), "variables CMake did not use")
        return output, build

    def test_cmake_configures_this_checkout_with_each_combination_this_machine_has(self):
        have_cuda = os.path.exists("/usr/local/cuda/include/nccl.h")
        have_pmix = subprocess.run(["pkg-config", "--exists", "pmix"]).returncode == 0
        for variants in self.combinations():
            if (variants["cuda"] and not have_cuda) or (variants["pmix"] and not have_pmix):
                continue
            with self.subTest(**variants):
                output, build = self.configure(variants)
                self.assertIn("ddl: NCCL backend (" if variants["cuda"] else "ddl: NCCL backend off", output)
                self.assertIn("ddl: PMIx bootstrap" if variants["pmix"] else "ddl: PMIx bootstrap off", output)
                with open(os.path.join(build, "python", "cmake_install.cmake")) as f:
                    python_install = f.read()
                self.assertEqual(f"/{PURELIB}\"" in python_install, variants["python"])
                with open(os.path.join(build, "cmake_install.cmake")) as f:
                    self.assertNotIn("modulefiles", f.read())

    @unittest.skipUnless(os.environ.get("DDL_TEST_GLOO_SOURCE"), "set DDL_TEST_GLOO_SOURCE to a Gloo checkout at the pinned commit")
    def test_gloo_resource_is_what_cmake_builds(self):
        output, build = self.configure(dict(self.variants), gloo_source=os.environ["DDL_TEST_GLOO_SOURCE"])
        self.assertIn("ddl: Gloo not found: building the pinned", output)
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            self.assertRegex(f.read(), r"FETCHCONTENT_SOURCE_DIR_GLOO:\w+=.*spack-resources/gloo")


if __name__ == "__main__":
    unittest.main()

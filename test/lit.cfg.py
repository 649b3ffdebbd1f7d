# lit configuration for mt: IR tests (.mlir), spec tests (.toml), CLI tests
# (.test) and the GoogleTest binary in unit/.
import os

import lit.formats

config.name = "mt"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir", ".toml", ".test"]
config.excludes = ["Inputs", "CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.mt_obj_root, "test")

config.environment["FILECHECK_OPTS"] = "--enable-var-scope"
# Deterministic, uncoloured tool output.
config.environment["LC_ALL"] = "C"
for var in ["MT_SHARED_DATA"]:
    if var in os.environ:
        config.environment[var] = os.environ[var]

path = os.pathsep.join([config.mt_tools_dir, config.llvm_tools_dir,
                        config.environment.get("PATH", os.environ["PATH"])])
config.environment["PATH"] = path
config.substitutions.append(("%mt_src_root", config.mt_src_root))
config.substitutions.append(("%mt_obj_root", config.mt_obj_root))

# GPT-2's real vocabulary lives beside the checkout on development machines.
shared = os.path.join(config.mt_src_root, "..", "shared", "data", "gpt2")
if os.path.isfile(os.path.join(shared, "vocab.json")):
    config.available_features.add("gpt2-data")
    config.substitutions.append(("%gpt2_data", shared))

# A small lit suite for test/harness/run-tests.test: its tests need a
# reference package (torch), GPT-2's files, or nothing; FAKE_FEATURES
# (comma-separated) says which features this "machine" has.
import os

import lit.formats

config.name = "mt"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".test"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = config.test_source_root
config.available_features.update(f for f in os.environ.get("FAKE_FEATURES", "").split(",") if f)
# FAKE_FAIL=1 makes plain.test fail.
config.substitutions.append(("%fake_result", "false" if os.environ.get("FAKE_FAIL") else "true"))

# The GoogleTest binaries (*-tests), run by lit as a separate suite (see ../lit.cfg.py).
import os

import lit.formats

config.name = "mt-unit"
config.test_format = lit.formats.GoogleTest(".", "-tests")
config.test_source_root = os.path.join(config.mt_obj_root, "test", "unit")
config.test_exec_root = config.test_source_root

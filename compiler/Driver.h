// Entry point of the `mtc` command line.
#ifndef MT_COMPILER_DRIVER_H
#define MT_COMPILER_DRIVER_H

namespace mt {
int runMtc(int argc, char **argv);
} // namespace mt

#endif // MT_COMPILER_DRIVER_H

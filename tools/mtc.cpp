// mtc: the mt compiler (see compiler/Driver.cpp).
#include "compiler/Driver.h"

int main(int argc, char **argv) { return mt::runMtc(argc, argv); }

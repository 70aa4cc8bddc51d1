/* tupper: one binary for the daemon and every client verb.  All the work is
 * in the runtime library; main only hands argv to it. */
#include "tupper.h"

int main(int argc, char **argv) { return tp_main(argc, argv); }

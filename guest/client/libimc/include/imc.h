/* The TruCluster MEMORY CHANNEL API: see <sys/imc.h>. */
#include <sys/imc.h>

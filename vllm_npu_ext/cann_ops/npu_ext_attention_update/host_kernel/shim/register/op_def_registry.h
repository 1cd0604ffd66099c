/**
 * Host stand-in for CANN's register/op_def_registry.h. The tiling source includes it for the
 * op registration macros, none of which the host launch needs.
 */
#ifndef REGISTER_OP_DEF_REGISTRY_H
#define REGISTER_OP_DEF_REGISTRY_H

#include "ascendc_host/graph.h"

#endif  // REGISTER_OP_DEF_REGISTRY_H

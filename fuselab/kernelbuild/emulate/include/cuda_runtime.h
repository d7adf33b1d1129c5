// Stub of the CUDA header of the same name for fuselab's CPU emulation: it all lives in fuselab_emu.h.
#pragma once
#include "fuselab_emu.h"

// (Interface only; this file keeps the library non-empty until the scheduler lands.)
#include "coordinator/step_executor.h"

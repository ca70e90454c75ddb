// KILN_API marks what libkiln.so exports: the public API of kiln/kiln.h. The library is compiled
// with hidden visibility, so everything else is internal to it (docs/embedding.md).
#pragma once

#if defined(__GNUC__)
#define KILN_API __attribute__((visibility("default")))
#else
#define KILN_API
#endif

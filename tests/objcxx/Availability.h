// Parse-only stand-in for the SDK's <Availability.h> (see README.md): which SDK the parse pretends
// to build against. -DUQR_STUB_SDK=13 declares a macOS 13 SDK (no __MAC_14_0 / __MAC_15_0, so
// Metal.h here leaves out what macOS 14 and 15 added); the default is a current (macOS 15) SDK.
#pragma once

#ifndef UQR_STUB_SDK
#define UQR_STUB_SDK 15
#endif

#define __MAC_13_0 130000
#if UQR_STUB_SDK >= 14
#define __MAC_14_0 140000
#endif
#if UQR_STUB_SDK >= 15
#define __MAC_15_0 150000
#endif
#define __MAC_OS_X_VERSION_MAX_ALLOWED (UQR_STUB_SDK * 10000)
#define __MAC_OS_X_VERSION_MIN_REQUIRED __MAC_13_0

// Parse-only stand-in (see ../README.md): the classes ATen/mps/MPSStream.h names.
#pragma once
#import <MetalPerformanceShaders/MetalPerformanceShaders.h>
@interface MPSGraph : NSObject
@end
@interface MPSGraphExecutionDescriptor : NSObject
@end
@interface MPSGraphCompilationDescriptor : NSObject
@end

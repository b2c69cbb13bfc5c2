// Parse-only stand-in (see ../README.md): the one class ATen/mps/MPSStream.h names.
#pragma once
#import <Metal/Metal.h>
@interface MPSCommandBuffer : NSObject
@end

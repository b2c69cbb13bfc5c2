// Parse-only stand-in for Apple's Metal framework (see ../README.md).
#pragma once
#import <Foundation/Foundation.h>

typedef struct {
  NSUInteger width, height, depth;
} MTLSize;
static inline MTLSize MTLSizeMake(NSUInteger width, NSUInteger height, NSUInteger depth) {
  MTLSize s = {width, height, depth};
  return s;
}

typedef enum : NSUInteger {
  MTLLanguageVersion3_0 = (3 << 16),
  MTLLanguageVersion3_1 = (3 << 16) + 1,
} MTLLanguageVersion;

@protocol MTLBuffer <NSObject>
@property(readonly) NSUInteger length;
@end

@protocol MTLFunction <NSObject>
@end

@protocol MTLComputePipelineState <NSObject>
@property(readonly) NSUInteger maxTotalThreadsPerThreadgroup;
@end

@protocol MTLLibrary <NSObject>
- (id<MTLFunction>)newFunctionWithName:(NSString*)functionName;
@end

@interface MTLCompileOptions : NSObject
@property(readwrite, nonatomic) MTLLanguageVersion languageVersion;
@end

@protocol MTLDevice <NSObject>
- (id<MTLLibrary>)newLibraryWithSource:(NSString*)source
                               options:(MTLCompileOptions*)options
                                 error:(NSError**)error;
- (id<MTLComputePipelineState>)newComputePipelineStateWithFunction:(id<MTLFunction>)computeFunction
                                                             error:(NSError**)error;
@end

@protocol MTLCommandEncoder <NSObject>
- (void)endEncoding;
@end

@protocol MTLComputeCommandEncoder <MTLCommandEncoder>
- (void)setComputePipelineState:(id<MTLComputePipelineState>)state;
- (void)setBuffer:(id<MTLBuffer>)buffer offset:(NSUInteger)offset atIndex:(NSUInteger)index;
- (void)setBytes:(const void*)bytes length:(NSUInteger)length atIndex:(NSUInteger)index;
- (void)setThreadgroupMemoryLength:(NSUInteger)length atIndex:(NSUInteger)index;
- (void)dispatchThreadgroups:(MTLSize)threadgroupsPerGrid threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup;
@end

@protocol MTLCommandQueue <NSObject>
@end

@protocol MTLSharedEvent <NSObject>
@end

@protocol MTLCommandBuffer <NSObject>
@end
typedef void (^MTLCommandBufferHandler)(id<MTLCommandBuffer>);

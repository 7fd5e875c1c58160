package codec

import "context"

// Preparer is an optional interface of a Decoder whose Decode depends on
// something outside the value, such as a writer schema fetched from a schema
// registry by the id in the value's prefix.
//
// A caller that can wait calls Prepare(ctx, value) before Decode. A nil error
// means Decode will not need to wait for that value: either it decodes, or it
// is rejected for good (not in the expected format, an id the registry says
// does not exist) and may be dead-lettered. A non-nil error means "not now":
// the dependency is unavailable (the registry is down, answers 5xx, or times
// out), the value must not be dead-lettered, and the caller should hold it and
// call Prepare again later, in order, before decoding anything after it.
//
// Decoders built by NewDecoder need no preparation and do not implement it;
// callers that never call Prepare (tests, tools) still get correct results
// from Decode, which then waits for the dependency itself.
type Preparer interface {
	Prepare(ctx context.Context, value []byte) error
}

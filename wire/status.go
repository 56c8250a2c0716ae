package wire

import (
	"fmt"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
)

// InvalidArgument is the error for a request field the caller got wrong:
// "invalid <field>: <reason>", with a BadRequest detail naming the field so
// clients can point at it.
func InvalidArgument(field, reason string) error {
	st := status.New(codes.InvalidArgument, fmt.Sprintf("invalid %s: %s", field, reason))
	return withDetail(st, &errdetails.BadRequest{
		FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: field, Description: reason}},
	})
}

// ResourceExhausted is the error for a request refused because a limit is
// reached (concurrent generations, queued drafts, memory): "<resource>
// exhausted (<used> of <limit> in use)", plus when to retry if retryAfter is
// positive, carried as a RetryInfo detail too (see RetryAfter).
func ResourceExhausted(resource string, used, limit int64, retryAfter time.Duration) error {
	msg := fmt.Sprintf("%s exhausted (%d of %d in use)", resource, used, limit)
	if retryAfter <= 0 {
		return status.Error(codes.ResourceExhausted, msg+"; retry later")
	}
	st := status.New(codes.ResourceExhausted, fmt.Sprintf("%s; retry in %v", msg, retryAfter))
	return withDetail(st, &errdetails.RetryInfo{RetryDelay: durationpb.New(retryAfter)})
}

// RetryAfter returns the delay a ResourceExhausted error asks for.
func RetryAfter(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return 0, false
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

// withDetail attaches detail to st. Attaching fails only for a message
// that cannot be marshalled, which errdetails messages always can; the
// error without its detail beats no error.
func withDetail(st *status.Status, detail protoadapt.MessageV1) error {
	if d, err := st.WithDetails(detail); err == nil {
		return d.Err()
	}
	return st.Err()
}

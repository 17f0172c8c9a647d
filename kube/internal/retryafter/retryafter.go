// Package retryafter carries the delay an API server asks for before the
// next try to the dispatcher's backoff, for every adapter of the kube
// family (kube, kube/scheduler, kube/writer).
//
// The dispatcher honours a RetryAfter() time.Duration method anywhere in a
// failed execution's error chain (dispatch.RetryPolicy); Error adds one to
// an API error and unwraps to it, so errors.Is, errors.As and every
// apierrors.Is… still see the API's error.
package retryafter

import (
	"errors"
	"math"
	"net/http"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// Error is an error with the delay its server asked for.
type Error struct {
	Err   error
	Delay time.Duration
}

func (e *Error) Error() string             { return e.Err.Error() }
func (e *Error) Unwrap() error             { return e.Err }
func (e *Error) RetryAfter() time.Duration { return e.Delay }

// Wrap returns err with delay d, or err itself if it is nil or d is not
// positive.
func Wrap(err error, d time.Duration) error {
	if err == nil || d <= 0 {
		return err
	}
	return &Error{Err: err, Delay: d}
}

// FromStatus returns err with the delay its Status asks for
// (details.retryAfterSeconds, apierrors.SuggestsClientDelay), if any.
func FromStatus(err error) error {
	if err == nil {
		return nil
	}
	s, _ := apierrors.SuggestsClientDelay(err)
	return Wrap(err, time.Duration(s)*time.Second)
}

// Strip returns the error err carries if err is an *Error, else err.
func Strip(err error) error {
	if e, ok := err.(*Error); ok {
		return e.Err
	}
	return err
}

// Header reads a Retry-After header in whole seconds, as client-go does
// (an HTTP date is not read, nor by client-go). A delay too long for a
// time.Duration (about 292 years), however many digits it has, is read as
// the longest one, rather than wrapping round to a short or negative delay.
func Header(h http.Header) (time.Duration, bool) {
	v := h.Get("Retry-After")
	if v == "" {
		return 0, false
	}
	s, err := strconv.ParseInt(v, 10, 64)
	switch {
	case errors.Is(err, strconv.ErrRange) && s > 0, err == nil && s > math.MaxInt64/int64(time.Second):
		return math.MaxInt64, true
	case err != nil || s < 0:
		return 0, false
	}
	return time.Duration(s) * time.Second, true
}

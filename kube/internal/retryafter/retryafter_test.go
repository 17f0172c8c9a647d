package retryafter

import (
	"errors"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

func TestHeader(t *testing.T) {
	longest := time.Duration(math.MaxInt64)
	for v, want := range map[string]time.Duration{
		"7": 7 * time.Second, "0": 0,
		"9223372036": 9223372036 * time.Second, // the longest that fits
		"+7":         7 * time.Second, "9223372037": longest, "9223372036854775807": longest, "99999999999999999999999": longest,
	} {
		d, ok := Header(http.Header{"Retry-After": {v}})
		assert.True(t, ok, v)
		assert.Equal(t, want, d, v)
	}
	for _, v := range []string{"", "-1", "-99999999999999999999999", " 7", "1.5", "soon", "Wed, 21 Oct 2015 07:28:00 GMT"} {
		_, ok := Header(http.Header{"Retry-After": {v}})
		assert.False(t, ok, "%q", v)
	}
	_, ok := Header(http.Header{})
	assert.False(t, ok, "no header")
}

func TestWrap(t *testing.T) {
	base := apierrors.NewTooManyRequests("slow down", 3)
	var hint interface{ RetryAfter() time.Duration }

	err := FromStatus(base)
	if assert.ErrorAs(t, err, &hint) {
		assert.Equal(t, 3*time.Second, hint.RetryAfter(), "the Status's retryAfterSeconds")
	}
	assert.True(t, apierrors.IsTooManyRequests(err), "the API error is still seen")
	assert.Same(t, base, Strip(err))

	err = Wrap(base, time.Minute)
	if assert.ErrorAs(t, err, &hint) {
		assert.Equal(t, time.Minute, hint.RetryAfter())
	}

	plain := errors.New("refused")
	assert.Same(t, plain, Wrap(plain, 0), "no delay: unchanged")
	assert.Same(t, plain, FromStatus(plain), "no Status: unchanged")
	assert.Same(t, plain, Strip(plain))
	assert.NoError(t, Wrap(nil, time.Second))
	assert.NoError(t, FromStatus(nil))
}

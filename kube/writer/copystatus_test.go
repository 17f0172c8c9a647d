package writer_test

import (
	"testing"

	"github.com/coalescer/dispatch/kube/writer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// CopyStatus of a nil object is a change that fails saying so, not one
// that blames the type for having no status.
func TestCopyStatusOfNil(t *testing.T) {
	err := writer.CopyStatus[deploy](nil)(deployment("a"))
	require.ErrorContains(t, err, "desired is nil")
	assert.NotContains(t, err.Error(), "has no status")
	err = writer.CopyStatus[*unstructured.Unstructured](nil)(&unstructured.Unstructured{Object: map[string]any{}})
	require.ErrorContains(t, err, "desired is nil")
}

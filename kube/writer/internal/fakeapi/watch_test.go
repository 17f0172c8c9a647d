package fakeapi

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestWatchNeverFallsBehind: a watcher that reads nothing while 500
// changes are made (the tracker's own watch panics at 100) then gets every
// event, in order, with the changes' resourceVersions; a watch of another
// namespace sees none of them, and Stop ends both watches' goroutines.
func TestWatchNeverFallsBehind(t *testing.T) {
	cs := fake.NewClientset()
	_, err := Install(&cs.Fake, cs.Tracker())
	require.NoError(t, err)
	cms := cs.CoreV1().ConfigMaps("a")
	w, err := cms.Watch(t.Context(), metav1.ListOptions{})
	require.NoError(t, err)
	other, err := cs.CoreV1().ConfigMaps("b").Watch(t.Context(), metav1.ListOptions{})
	require.NoError(t, err)

	cm, err := cms.Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "c"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	rvs := []string{cm.ResourceVersion}
	const updates = 500
	for i := range updates {
		cm.Data = map[string]string{"i": fmt.Sprint(i)}
		cm, err = cms.Update(t.Context(), cm, metav1.UpdateOptions{})
		require.NoError(t, err)
		rvs = append(rvs, cm.ResourceVersion)
	}
	require.NoError(t, cms.Delete(t.Context(), "c", metav1.DeleteOptions{}))

	for i, rv := range rvs {
		ev := <-w.ResultChan()
		want := watch.Modified
		if i == 0 {
			want = watch.Added
		}
		require.Equal(t, want, ev.Type, "event %d", i)
		assert.Equal(t, rv, ev.Object.(*corev1.ConfigMap).ResourceVersion, "event %d", i)
	}
	ev := <-w.ResultChan()
	assert.Equal(t, watch.Deleted, ev.Type)
	assert.Equal(t, "c", ev.Object.(*corev1.ConfigMap).Name)
	select {
	case ev := <-other.ResultChan():
		t.Fatalf("a watch of namespace b saw %v", ev)
	default:
	}
	w.Stop()
	other.Stop()
	_, open := <-w.ResultChan()
	assert.False(t, open, "the result channel is closed once the watch stops")
}

package apiserver

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// whoAmI returns the user the server sees behind c.
func whoAmI(t *testing.T, c *rest.Config) authenticationv1.UserInfo {
	t.Helper()
	client, err := kubernetes.NewForConfig(c)
	require.NoError(t, err)
	r, err := client.AuthenticationV1().SelfSubjectReviews().Create(context.Background(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	require.NoError(t, err)
	return r.Status.UserInfo
}

// TestStart: a server with the default authorization (AlwaysAllow) and
// one with RBAC on the same etcd; on each, the admin is a member of
// system:masters, Config is TestUser through the proxy, and a service
// account's config is that service account; with RBAC, TestUser and the
// service account may do what a binding allows, no more.
func TestStart(t *testing.T) {
	ctx := context.Background()
	s := Start(t)
	t.Logf("started in %v", s.StartupTime)

	admin := whoAmI(t, s.AdminConfig)
	assert.Equal(t, adminUser, admin.Username)
	assert.Contains(t, admin.Groups, "system:masters")

	user := whoAmI(t, s.Config)
	assert.Equal(t, TestUser, user.Username)
	assert.Contains(t, user.Groups, TestGroup)
	assert.NotContains(t, user.Groups, "system:masters")
	reviews := s.Proxy.Filter(func(r Request) bool { return r.Resource == "selfsubjectreviews" })
	assert.Len(t, reviews, 1, "Config goes through the proxy, AdminConfig does not")

	_, err := s.AdminClient.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "sa"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	sa := whoAmI(t, s.ServiceAccountConfig(t, "sa", "controller"))
	assert.Equal(t, "system:serviceaccount:sa:controller", sa.Username)
	assert.Contains(t, sa.Groups, "system:serviceaccounts:sa")
	again := whoAmI(t, s.ServiceAccountConfig(t, "sa", "controller"))
	assert.Equal(t, sa.Username, again.Username, "a second token for an existing account")

	rbac := Start(t, WithEtcd(s.Etcd), WithFlags("--authorization-mode=RBAC"))
	_, err = rbac.AdminClient.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "sa"}}, metav1.CreateOptions{})
	require.NoError(t, err, "each server stores under a prefix of its own")
	_, err = rbac.Client.CoreV1().Pods("sa").List(ctx, metav1.ListOptions{})
	assert.True(t, apierrors.IsForbidden(err), "TestUser without a binding: %v", err)
	saClient, err := kubernetes.NewForConfig(rbac.ServiceAccountConfig(t, "sa", "controller"))
	require.NoError(t, err)
	_, err = saClient.CoreV1().Pods("sa").List(ctx, metav1.ListOptions{})
	assert.True(t, apierrors.IsForbidden(err), "a service account without a binding: %v", err)

	// A role of its own: the aggregated roles (view, edit) are empty
	// here, no controller-manager fills them.
	_, err = rbac.AdminClient.RbacV1().Roles("sa").Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "pod-reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = rbac.AdminClient.RbacV1().RoleBindings("sa").Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "pod-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "pod-reader"},
		Subjects: []rbacv1.Subject{
			{Kind: rbacv1.ServiceAccountKind, Namespace: "sa", Name: "controller"},
			{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: TestGroup},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	// RBAC reads bindings through an informer: allow it a moment.
	var errSA, errUser error
	assert.Eventually(t, func() bool {
		_, errSA = saClient.CoreV1().Pods("sa").List(ctx, metav1.ListOptions{})
		_, errUser = rbac.Client.CoreV1().Pods("sa").List(ctx, metav1.ListOptions{})
		return errSA == nil && errUser == nil
	}, time.Minute, 50*time.Millisecond, "the binding lets both list pods")
	require.NoError(t, errSA, "the service account")
	require.NoError(t, errUser, "TestUser")
	_, err = saClient.CoreV1().Pods("sa").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}}, metav1.CreateOptions{})
	assert.True(t, apierrors.IsForbidden(err), "the role does not create: %v", err)
}

// TestSyncBuffer: a process's output keeps its latest megabyte.
func TestSyncBuffer(t *testing.T) {
	var b syncBuffer
	b.Write([]byte("first\n"))
	assert.Equal(t, "first\n", b.String())
	line := strings.Repeat("x", 1023) + "\n"
	for range syncBufferCap / len(line) {
		b.Write([]byte(line))
	}
	b.Write([]byte("last\n"))
	got := b.String()
	assert.Len(t, got, syncBufferCap)
	assert.True(t, strings.HasSuffix(got, line+"last\n"))
	assert.NotContains(t, got, "first")
	b.Write([]byte(strings.Repeat("y", syncBufferCap+10)))
	assert.Equal(t, strings.Repeat("y", syncBufferCap), b.String())
}

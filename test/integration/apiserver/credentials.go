package apiserver

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Identity of the superuser that Server.AdminConfig authenticates as,
// through the static token file: the group system:masters is never
// throttled and, whatever the authorization mode, may do anything.
const (
	adminUser  = "dispatch-admin"
	adminGroup = "system:masters"
)

// credentials are what one kube-apiserver run authenticates with,
// generated for the run into a directory of its own: nothing is shared
// between servers, nothing outlives the test.
type credentials struct {
	// caPEM is the certificate of the authority that signed the serving
	// certificate: the clients trust it alone.
	caPEM []byte
	// certFile and keyFile are the serving certificate (for 127.0.0.1 and
	// localhost) and its key: --tls-cert-file, --tls-private-key-file.
	certFile, keyFile string
	// serviceAccountKeyFile holds the key that signs service account
	// tokens and verifies them: --service-account-signing-key-file and
	// --service-account-key-file.
	serviceAccountKeyFile string
	// tokenFile is the static token file (--token-auth-file) that
	// authenticates adminToken as adminUser and testToken as TestUser.
	tokenFile             string
	adminToken, testToken string
}

// certValidity is how long the generated certificates are valid: longer
// than any test, short enough that a leaked one is worthless.
const certValidity = 24 * time.Hour

// newCredentials generates fresh credentials into dir.
func newCredentials(dir string) (*credentials, error) {
	c := &credentials{
		certFile:              filepath.Join(dir, "serving.crt"),
		keyFile:               filepath.Join(dir, "serving.key"),
		serviceAccountKeyFile: filepath.Join(dir, "service-account.key"),
		tokenFile:             filepath.Join(dir, "tokens.csv"),
		adminToken:            randomHex(16),
		testToken:             randomHex(16),
	}
	now := time.Now()
	ca, err := newAuthority(now)
	if err != nil {
		return nil, err
	}
	c.caPEM = ca.certPEM()
	servingCertPEM, servingKeyPEM, err := ca.issueServing(now)
	if err != nil {
		return nil, err
	}
	saKeyPEM, err := newKeyPEM()
	if err != nil {
		return nil, err
	}
	for _, f := range []struct {
		path string
		data []byte
	}{
		{c.certFile, servingCertPEM},
		{c.keyFile, servingKeyPEM},
		{c.serviceAccountKeyFile, saKeyPEM},
		{c.tokenFile, c.tokens()},
	} {
		if err := os.WriteFile(f.path, f.data, 0o600); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// tokens returns the static token file's content, a line
// token,user,uid,"group1,group2" for each of the admin and [TestUser].
func (c *credentials) tokens() []byte {
	return fmt.Appendf(nil, "%s,%s,%s-uid,%q\n%s,%s,%s-uid,%q\n",
		c.adminToken, adminUser, adminUser, adminGroup,
		c.testToken, TestUser, TestUser, TestGroup)
}

// authority is the certificate authority of one run's credentials: it
// signs the serving certificate, and the clients trust it alone.
type authority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// newAuthority generates a key and a self-signed CA certificate for it,
// valid from a minute before now for [certValidity].
func newAuthority(now time.Time) (*authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	template := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{CommonName: "dispatch-test-ca"},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(certValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &authority{cert: cert, key: key}, nil
}

// certPEM returns a's certificate, PEM-encoded.
func (a *authority) certPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.cert.Raw})
}

// issueServing generates a key and a serving certificate for it, for
// 127.0.0.1 and localhost, signed by a and valid from a minute before now
// for [certValidity]. It returns both PEM-encoded.
func (a *authority) issueServing(now time.Time) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: randomSerial(),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(certValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
	}, a.cert, &key.PublicKey, a.key)
	if err != nil {
		return nil, nil, err
	}
	if keyPEM, err = ecKeyPEM(key); err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

// flags are the kube-apiserver flags that make it use c.
func (c *credentials) flags() []string {
	return []string{
		"--tls-cert-file=" + c.certFile,
		"--tls-private-key-file=" + c.keyFile,
		"--token-auth-file=" + c.tokenFile,
		"--service-account-issuer=" + serviceAccountIssuer,
		"--service-account-signing-key-file=" + c.serviceAccountKeyFile,
		"--service-account-key-file=" + c.serviceAccountKeyFile,
	}
}

// serviceAccountIssuer is the issuer of the service account tokens the
// server signs, and so their audience by default.
const serviceAccountIssuer = "https://kubernetes.default.svc.cluster.local"

// newKeyPEM generates an ECDSA P-256 key and returns it PEM-encoded.
func newKeyPEM() ([]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	return ecKeyPEM(key)
}

// ecKeyPEM returns k PEM-encoded, as an EC PRIVATE KEY block.
func ecKeyPEM(k *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

// randomSerial returns a random 128-bit certificate serial number.
func randomSerial() *big.Int {
	b, _ := hex.DecodeString(randomHex(16))
	return new(big.Int).SetBytes(b)
}

// randomHex returns n random bytes, hex-encoded.
func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return hex.EncodeToString(b)
}

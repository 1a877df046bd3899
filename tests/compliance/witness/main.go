// Command witness checks a cosigned tree head without amdflash, over Go's own
// golang.org/x/mod/sumdb/note: the log's signature by its verifier key (log.vkey), and at least
// QUORUM cosignatures (C2SP tlog-cosignature v1: timestamped Ed25519 over "cosignature/v1",
// "time T" and the checkpoint's text) by the witness keys listed one a line (witnesses.vkeys).
// It prints the tree head, each witness that cosigned and when, and exits 0; or one line and 1.
//
//	witness LOG.VKEY WITNESSES.VKEYS QUORUM CHECKPOINT
//
// A test program (tests/compliance/test_witness_outside.py), never amdflash's code.
package main

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/mod/sumdb/note"
)

type cosigner struct {
	name string
	hash uint32
	key  ed25519.PublicKey
	when map[string]uint64 // name -> the time its verified cosignature says
}

func (c *cosigner) Name() string    { return c.name }
func (c *cosigner) KeyHash() uint32 { return c.hash }

// Verify checks a timestamped_signature (8-byte big-endian time, then Ed25519) over the
// cosigned message: its header and time lines, then the note's text.
func (c *cosigner) Verify(msg, sig []byte) bool {
	if len(sig) != 8+ed25519.SignatureSize {
		return false
	}
	t := binary.BigEndian.Uint64(sig[:8])
	if t >= 1<<63 {
		return false
	}
	signed := append([]byte(fmt.Sprintf("cosignature/v1\ntime %d\n", t)), msg...)
	if !ed25519.Verify(c.key, signed, sig[8:]) {
		return false
	}
	c.when[c.name] = t
	return true
}

func witnessKey(vkey string, when map[string]uint64) (*cosigner, error) {
	parts := strings.SplitN(strings.TrimSpace(vkey), "+", 3)
	if len(parts) != 3 {
		return nil, fmt.Errorf("not a verifier key: %q", vkey)
	}
	hash, err := strconv.ParseUint(parts[1], 16, 32)
	if err != nil {
		return nil, fmt.Errorf("key hash of %q: %v", vkey, err)
	}
	raw, err := base64.StdEncoding.DecodeString(parts[2])
	if err != nil || len(raw) != 1+ed25519.PublicKeySize || raw[0] != 0x04 {
		return nil, fmt.Errorf("not a timestamped Ed25519 cosignature key (type 0x04): %q", vkey)
	}
	sum := sha256.Sum256(append(append([]byte(parts[0]+"\n"), 0x04), raw[1:]...))
	if binary.BigEndian.Uint32(sum[:4]) != uint32(hash) {
		return nil, fmt.Errorf("key hash does not match name and key: %q", vkey)
	}
	return &cosigner{name: parts[0], hash: uint32(hash), key: raw[1:], when: when}, nil
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "witness: "+format+"\n", args...)
	os.Exit(1)
}

func main() {
	if len(os.Args) != 5 {
		fail("usage: witness LOG.VKEY WITNESSES.VKEYS QUORUM CHECKPOINT")
	}
	logKey, err := os.ReadFile(os.Args[1])
	if err != nil {
		fail("%v", err)
	}
	logVerifier, err := note.NewVerifier(strings.TrimSpace(string(logKey)))
	if err != nil {
		fail("log key: %v", err)
	}
	listed, err := os.ReadFile(os.Args[2])
	if err != nil {
		fail("%v", err)
	}
	quorum, err := strconv.Atoi(os.Args[3])
	if err != nil || quorum < 1 {
		fail("quorum %q: a whole number of at least 1", os.Args[3])
	}
	when := map[string]uint64{}
	verifiers := []note.Verifier{logVerifier}
	for _, line := range strings.Split(string(listed), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		w, err := witnessKey(line, when)
		if err != nil {
			fail("%v", err)
		}
		verifiers = append(verifiers, w)
	}
	msg, err := os.ReadFile(os.Args[4])
	if err != nil {
		fail("%v", err)
	}
	n, err := note.Open(msg, note.VerifierList(verifiers...))
	if err != nil {
		fail("the cosigned tree head does not verify: %v", err)
	}
	logSigned := false
	for _, s := range n.Sigs {
		if s.Name == logVerifier.Name() && s.Hash == logVerifier.KeyHash() {
			logSigned = true
		}
	}
	if !logSigned {
		fail("the tree head is not signed by the log key %s", logVerifier.Name())
	}
	lines := strings.SplitN(n.Text, "\n", 4)
	if len(lines) < 4 || lines[0] != logVerifier.Name() {
		fail("not a checkpoint of the log %s", logVerifier.Name())
	}
	if _, err := strconv.ParseUint(lines[1], 10, 64); err != nil {
		fail("not a checkpoint: tree size %q", lines[1])
	}
	fmt.Printf("tree head %s: %s entries, root %s, signed by the log key\n", lines[0], lines[1], lines[2])
	names := []string{}
	for name, t := range when {
		names = append(names, name)
		fmt.Printf("cosigned by %s at %s\n", name, time.Unix(int64(t), 0).UTC().Format(time.RFC3339))
	}
	if len(names) < quorum {
		fail("cosigned by %d of the witnesses listed, %d needed", len(names), quorum)
	}
	fmt.Printf("OK: cosigned by %d witnesses (quorum %d)\n", len(names), quorum)
}

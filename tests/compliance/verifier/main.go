// Command verifier checks amdflash's transparency log and receipts with no amdflash code:
// Go's own golang.org/x/mod/sumdb/note (signed notes) and sumdb/tlog (RFC 6962 proofs), and
// the standard library. A test program (tests/compliance), never product code.
//
//	verifier note VKEY NOTE                        a tree head's signature; prints size and root
//	verifier inclusion VKEY TLOG-PROOF LEAF        a C2SP tlog-proof of the bytes in LEAF
//	verifier consistency VKEY OLD-NOTE PROOF       PROOF: "old N", hashes, blank line, new note
//	verifier pae RECEIPT PAE-OUT SIG-OUT           a DSSE envelope's PAE and signature, for openssl
//
// Exit 0 when the check holds; 1 with one line on stderr when it does not.
package main

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/ioutil"
	"os"
	"strconv"
	"strings"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

type head struct {
	origin string
	size   int64
	root   tlog.Hash
}

func read(path string) []byte {
	data, err := ioutil.ReadFile(path)
	if err != nil {
		fail(err)
	}
	return data
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "verifier:", err)
	os.Exit(1)
}

// openHead checks the note's signature by the log key and parses its checkpoint body.
func openHead(vkey string, msg []byte) head {
	v, err := note.NewVerifier(strings.TrimSpace(vkey))
	if err != nil {
		fail(err)
	}
	n, err := note.Open(msg, note.VerifierList(v))
	if err != nil {
		fail(err)
	}
	lines := strings.Split(n.Text, "\n")
	if len(lines) < 4 || lines[0] != v.Name() {
		fail(errors.New("not a checkpoint of this log (origin line)"))
	}
	size, err := strconv.ParseInt(lines[1], 10, 64)
	if err != nil || size < 0 || strconv.FormatInt(size, 10) != lines[1] {
		fail(errors.New("bad tree size line"))
	}
	raw, err := base64.StdEncoding.DecodeString(lines[2])
	if err != nil || len(raw) != tlog.HashSize {
		fail(errors.New("bad root hash line"))
	}
	var h tlog.Hash
	copy(h[:], raw)
	return head{lines[0], size, h}
}

// hashes reads base64 hash lines up to a blank line; the rest is returned.
func hashes(sc *bufio.Scanner) []tlog.Hash {
	var out []tlog.Hash
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			return out
		}
		raw, err := base64.StdEncoding.DecodeString(line)
		if err != nil || len(raw) != tlog.HashSize {
			fail(fmt.Errorf("bad proof hash line %q", line))
		}
		var h tlog.Hash
		copy(h[:], raw)
		out = append(out, h)
	}
	fail(errors.New("proof ends before its checkpoint"))
	return nil
}

// rest is what follows the first blank line (the checkpoint note, verbatim).
func rest(data []byte) []byte {
	i := bytes.Index(data, []byte("\n\n"))
	if i < 0 {
		fail(errors.New("no checkpoint after the proof"))
	}
	return data[i+2:]
}

func inclusion(vkey, proofPath, leafPath string) {
	data := read(proofPath)
	sc := bufio.NewScanner(bytes.NewReader(data))
	if !sc.Scan() || sc.Text() != "c2sp.org/tlog-proof@v1" {
		fail(errors.New("not a c2sp.org/tlog-proof@v1 file"))
	}
	sc.Scan()
	line := sc.Text()
	if strings.HasPrefix(line, "extra ") {
		sc.Scan()
		line = sc.Text()
	}
	if !strings.HasPrefix(line, "index ") {
		fail(errors.New("no index line"))
	}
	index, err := strconv.ParseInt(strings.TrimPrefix(line, "index "), 10, 64)
	if err != nil {
		fail(err)
	}
	proof := hashes(sc)
	h := openHead(vkey, rest(data))
	if index >= h.size {
		fail(fmt.Errorf("index %d is outside the tree of %d", index, h.size))
	}
	if err := tlog.CheckRecord(tlog.RecordProof(proof), h.size, h.root, index, tlog.RecordHash(read(leafPath))); err != nil {
		fail(err)
	}
	fmt.Printf("included: leaf %d of %s tree size %d\n", index, h.origin, h.size)
}

func consistency(vkey, oldPath, proofPath string) {
	old := openHead(vkey, read(oldPath))
	data := read(proofPath)
	sc := bufio.NewScanner(bytes.NewReader(data))
	if !sc.Scan() || !strings.HasPrefix(sc.Text(), "old ") {
		fail(errors.New("no 'old N' line"))
	}
	n, err := strconv.ParseInt(strings.TrimPrefix(sc.Text(), "old "), 10, 64)
	if err != nil || n != old.size {
		fail(fmt.Errorf("the proof is from size %q, the old tree head is of %d", sc.Text(), old.size))
	}
	proof := hashes(sc)
	cur := openHead(vkey, rest(data))
	if old.size == cur.size {
		if old.root != cur.root || len(proof) != 0 {
			fail(errors.New("two different trees of one size"))
		}
	} else if old.size > 0 {
		if err := tlog.CheckTree(tlog.TreeProof(proof), cur.size, cur.root, old.size, old.root); err != nil {
			fail(err)
		}
	} else if len(proof) != 0 {
		fail(errors.New("a proof from the empty tree has no hashes"))
	}
	fmt.Printf("consistent: %s tree %d is a prefix of tree %d\n", cur.origin, old.size, cur.size)
}

// pae writes the DSSE pre-authentication encoding of the envelope's payload, and its first
// signature, so that openssl can check the signature with the host key.
func pae(receiptPath, paeOut, sigOut string) {
	var env struct {
		PayloadType string `json:"payloadType"`
		Payload     string `json:"payload"`
		Signatures  []struct {
			Sig string `json:"sig"`
		} `json:"signatures"`
	}
	if err := json.Unmarshal(read(receiptPath), &env); err != nil {
		fail(err)
	}
	body, err := base64.StdEncoding.DecodeString(env.Payload)
	if err != nil || len(env.Signatures) == 0 {
		fail(errors.New("not a DSSE envelope with a signature"))
	}
	sig, err := base64.StdEncoding.DecodeString(env.Signatures[0].Sig)
	if err != nil {
		fail(err)
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "DSSEv1 %d %s %d ", len(env.PayloadType), env.PayloadType, len(body))
	b.Write(body)
	if err := ioutil.WriteFile(paeOut, b.Bytes(), 0o644); err != nil {
		fail(err)
	}
	if err := ioutil.WriteFile(sigOut, sig, 0o644); err != nil {
		fail(err)
	}
}

func main() {
	a := os.Args[1:]
	switch {
	case len(a) == 3 && a[0] == "note":
		h := openHead(string(read(a[1])), read(a[2]))
		fmt.Printf("signed: %s tree size %d root %s\n", h.origin, h.size, h.root)
	case len(a) == 4 && a[0] == "inclusion":
		inclusion(string(read(a[1])), a[2], a[3])
	case len(a) == 4 && a[0] == "consistency":
		consistency(string(read(a[1])), a[2], a[3])
	case len(a) == 4 && a[0] == "pae":
		pae(a[1], a[2], a[3])
	default:
		fmt.Fprintln(os.Stderr, "usage: verifier note|inclusion|consistency|pae ...")
		os.Exit(2)
	}
}

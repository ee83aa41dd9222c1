// Command kubeletchecksum computes the kubelet's Memory Manager checkpoint checksum with the
// real go-spew, as an independent peer for the agent's own implementation: FNV-1a 32 of
// go-spew's "%#v" under the kubelet's hash configuration (k8s.io/utils/dump.ForHash).
//
//	kubeletchecksum sum current|legacy FILE...   one checksum per file, in order
//	kubeletchecksum write current|legacy FILE    the file as the kubelet writes it, checksum set
//	kubeletchecksum text current|legacy FILE     the text that is hashed (checksum zeroed)
//	kubeletchecksum verify current|legacy|v3 FILE...  "ok" or "corrupt" per file, as the kubelet reads it
//	kubeletchecksum write v3 FILE                the file as the newest kubelet writes it: the data as
//	                                             a JSON string with its checksum, and the legacy fields
//	                                             inline with the legacy checksum
package main

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"os"

	"github.com/davecgh/go-spew/spew"

	"kubeletchecksum/checksum"
	legacy "kubeletchecksum/legacy/state"
	"kubeletchecksum/state"
)

var forHash = &spew.ConfigState{
	Indent:                  " ",
	SortKeys:                true,
	DisableMethods:          true,
	SpewKeys:                true,
	DisablePointerAddresses: true,
	DisableCapacities:       true,
}

func sum(object interface{}) uint64 {
	hash := fnv.New32a()
	_, _ = hash.Write([]byte(forHash.Sprintf("%#v", object)))
	return uint64(hash.Sum32())
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(2)
}

func main() {
	if len(os.Args) < 4 {
		fail("usage: kubeletchecksum sum|write current|legacy FILE...")
	}
	command, format := os.Args[1], os.Args[2]
	for _, path := range os.Args[3:] {
		blob, err := os.ReadFile(path)
		if err != nil {
			fail("%v", err)
		}
		var out interface{}
		if command == "verify" {
			fmt.Println(verify(format, path, blob))
			continue
		}
		if format == "v3" {
			fmt.Println(writeV3(path, blob))
			continue
		}
		switch format {
		case "current":
			c := state.New()
			if err := json.Unmarshal(blob, c); err != nil {
				fail("%s: %v", path, err)
			}
			c.Checksum = 0
			c.Checksum = checksum.Checksum(sum(c))
			out = c
		case "legacy":
			c := legacy.New()
			if err := json.Unmarshal(blob, c); err != nil {
				fail("%s: %v", path, err)
			}
			c.Checksum = 0
			c.Checksum = checksum.Checksum(sum(c))
			out = c
		default:
			fail("unknown format %q", format)
		}
		switch command {
		case "text":
			switch c := out.(type) {
			case *state.MemoryManagerCheckpoint:
				c.Checksum = 0
			case *legacy.MemoryManagerCheckpoint:
				c.Checksum = 0
			}
			fmt.Println(forHash.Sprintf("%#v", out))
		case "sum":
			switch c := out.(type) {
			case *state.MemoryManagerCheckpoint:
				fmt.Println(uint64(c.Checksum))
			case *legacy.MemoryManagerCheckpoint:
				fmt.Println(uint64(c.Checksum))
			}
		case "write":
			blob, err := json.Marshal(out)
			if err != nil {
				fail("%v", err)
			}
			fmt.Println(string(blob))
		default:
			fail("unknown command %q", command)
		}
	}
}

// verify reads a file into a fresh checkpoint and compares its checksum with the content's, as
// the kubelet's VerifyChecksum does.
func verify(format, path string, blob []byte) string {
	var stored, computed checksum.Checksum
	switch format {
	case "current":
		c := state.New()
		if err := json.Unmarshal(blob, c); err != nil {
			fail("%s: %v", path, err)
		}
		stored, c.Checksum = c.Checksum, 0
		computed = checksum.Checksum(sum(c))
	case "legacy":
		c := legacy.New()
		if err := json.Unmarshal(blob, c); err != nil {
			fail("%s: %v", path, err)
		}
		stored, c.Checksum = c.Checksum, 0
		computed = checksum.Checksum(sum(c))
	case "v3":
		var c legacy.CheckpointV3
		if err := json.Unmarshal(blob, &c); err != nil {
			fail("%s: %v", path, err)
		}
		stored, computed = c.DataChecksum, checksum.Checksum(sum(c.Data))
	default:
		fail("unknown format %q", format)
	}
	if stored == computed {
		return "ok"
	}
	return "corrupt"
}

// writeV3 writes the file the way the newest kubelet does (MarshalCheckpoint of V3).
func writeV3(path string, blob []byte) string {
	data := state.New()
	if err := json.Unmarshal(blob, data); err != nil {
		fail("%s: %v", path, err)
	}
	payload, err := json.Marshal(state.CheckpointData{
		PolicyName:   data.PolicyName,
		MachineState: data.MachineState,
		Entries:      data.Entries,
		PodEntries:   data.PodEntries,
	})
	if err != nil {
		fail("%v", err)
	}
	var out legacy.CheckpointV3
	out.Data = string(payload)
	out.DataChecksum = checksum.Checksum(sum(out.Data))
	out.PolicyName = data.PolicyName
	out.MachineState = data.MachineState
	out.Entries = data.Entries
	out.Checksum = checksum.Checksum(sum(&out.MemoryManagerCheckpoint))
	written, err := json.Marshal(out)
	if err != nil {
		fail("%v", err)
	}
	return string(written)
}

// The mpi backend's messages between ranks of one node: each rank has, in
// memory the node's ranks share, a ring of slots from every other rank of
// its node. A message that fits a slot is written there by its sender,
// whose send is then done, and copied out by its receiver, with no MPI
// call. A larger one goes through MPI as before (Open MPI's single-copy
// path), announced by an envelope in the ring. So every message between
// two ranks of a node passes the ring in the order sent, and receives
// match them there, by (source, tag) in the order posted, as MPI would: a
// message with no receive posted for it stays in its slot, and moves to a
// list of early messages only when a receive for a later one is posted or
// the ring fills.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

namespace kreg {

// One send or receive of the mpi backend.
struct MpiRequest {
  enum class Mail : uint8_t {
    kNone,    // MPI's: `request` tells when it is done
    kQueued,  // a send waiting for a free slot in its peer's ring
    kPosted,  // a receive waiting for its message in the ring
    kDone,    // done through the ring (`sent`, `code`)
  };
  MPI_Request request = MPI_REQUEST_NULL;
  bool send = false;
  Mail mail = Mail::kNone;
  int peer = 0, tag = 0, mpi_tag = 0;
  size_t bytes = 0;
  void* buf = nullptr;
  // A receive matched in the ring: the bytes its sender sent, and for a
  // large message of another size than expected, where MPI receives it
  // (never into buf: Open MPI's single-copy path writes a truncated
  // message past the receive's end).
  bool matched = false;
  size_t sent = 0;
  std::shared_ptr<char[]> drain;
  int code = MPI_SUCCESS;  // kDone: posting the MPI receive failed so
};

// MPI_Isend or MPI_Irecv of `bytes` at buf; returns MPI's code.
int PostMpi(bool send, void* buf, size_t bytes, int peer, int tag, MPI_Comm comm, MPI_Request* request);

class NodeMail {
 public:
  // Collective over comm. nullptr (on every rank of a node alike) where no
  // other rank of comm shares this one's node, more than kMaxRanks do, or
  // the shared memory cannot be had. Its end is this rank's alone.
  static std::unique_ptr<NodeMail> Create(MPI_Comm comm);
  ~NodeMail();

  static constexpr int kMaxRanks = 64;
  // Whether messages to and from `peer` pass the rings.
  bool Carries(int peer) const { return peers_[peer].in != nullptr; }
  // Messages of at most this many bytes travel in a slot.
  size_t max_inline() const { return payload_; }

  // A send to a peer it carries: the message in a slot (r is then done),
  // or for a larger one its envelope (r->request is the MPI send).
  void Send(MpiRequest* r);
  // A receive from a peer it carries: done from the ring, or (a large
  // message) handed on to MPI (r->mail kNone, r->request posted).
  void Receive(MpiRequest* r);
  // Writes what waits for room and matches what came, for every peer.
  void Progress();
  // Forgets a request given up on (queued or posted).
  void Withdraw(MpiRequest* r);

 private:
  struct Early {  // a message that came before its receive
    int tag = 0;
    bool via_mpi = false;
    size_t bytes = 0;
    std::string data;
  };
  struct Peer {
    char* in = nullptr;   // the ring from this peer (this rank's memory)
    char* out = nullptr;  // the ring to this peer (the peer's memory)
    uint64_t written = 0, taken_seen = 0;  // out: messages written; the peer's count, last read
    uint64_t read = 0;                     // in: messages taken
    std::deque<MpiRequest*> queued, posted;
    std::deque<Early> early;
  };
  struct SlotHead;

  NodeMail(MPI_Comm comm, char* base, size_t bytes, size_t payload)
      : comm_(comm), base_(base), bytes_(bytes), payload_(payload) {}
  SlotHead* Slot(char* ring, uint64_t n) const;
  void Flush(Peer& p);
  void Drain(Peer& p);
  void Deliver(MpiRequest* r, bool via_mpi, size_t bytes, const void* data);

  const MPI_Comm comm_;
  char* const base_;  // the node's segment, mapped
  const size_t bytes_, payload_;
  std::vector<Peer> peers_;    // by rank of comm
  std::vector<int> carried_;   // the ranks it carries
};

}  // namespace kreg

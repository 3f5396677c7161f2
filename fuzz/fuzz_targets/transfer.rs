//! Data-plane headers as the transfer server decodes a request (`Envelope<TransferRequest>`) and as the
//! transfer client decodes a reply (the leading request id, then a `TransferResponse` or, under id 0, an
//! `ErrorFrame`).
//!
//! Properties: no panic; an accepted request fits a stack `Head` (the client sends requests that way) and
//! decodes back to the same value; an accepted response re-encodes to the same value; the client's id read
//! agrees with `Frame::request_id`.
#![no_main]

use bytes::Bytes;
use crescent_fuzz::{reencodes_stably, write_seeds};
use crescent_proto::transfer::{GRANT_TAG_LEN, Grant, GrantRange, GrantUse, TransferRequest, TransferResponse};
use crescent_proto::wire::{Envelope, ErrorFrame, FRAME_PREFIX, Frame, Head, MAX_DATA_HEADER};
use crescent_proto::{ErrorCode, SegmentId};
use libfuzzer_sys::fuzz_target;

fn seeds() -> Vec<Vec<u8>> {
    let segment = SegmentId::random();
    let ranges = vec![GrantRange { offset: 4096, length: 1 << 20 }, GrantRange { offset: 1 << 30, length: 4096 }];
    let sealed = Grant { ranges, expires_ms: u64::MAX, epoch: 1, tag: [7; GRANT_TAG_LEN] };
    let carried = Some(GrantUse::Carried { slot: 2, range: 1, grant: sealed });
    let held = Some(GrantUse::Held { slot: 2, range: 0 });
    let mut out = vec![
        Frame::encode(1, &TransferRequest::Write { segment, offset: 4096, grant: None }, Bytes::new()).unwrap(),
        Frame::encode(5, &TransferRequest::Write { segment, offset: 4096, grant: carried }, Bytes::new()).unwrap(),
        Frame::encode(6, &TransferRequest::Read { segment, offset: 4096, length: 4096, grant: held }, Bytes::new())
            .unwrap(),
        Frame::encode(
            u64::MAX,
            &TransferRequest::Read { segment, offset: u64::MAX, length: 1 << 26, grant: None },
            Bytes::new(),
        )
        .unwrap(),
        Frame::encode(2, &TransferResponse::Written, Bytes::new()).unwrap(),
        Frame::encode(3, &TransferResponse::Data, Bytes::new()).unwrap(),
        Frame::encode(4, &TransferResponse::Error(ErrorCode::InvalidParams), Bytes::new()).unwrap(),
        Frame::encode(0, &ErrorFrame { code: ErrorCode::InvalidParams, message: "bad frame".into() }, Bytes::new())
            .unwrap(),
    ];
    out.iter_mut().map(|f| f.header.to_vec()).collect()
}

fuzz_target!(init: write_seeds(seeds), |data: &[u8]| {
    // Server side (the header length is bounded before it is read).
    if data.len() <= MAX_DATA_HEADER {
        if let Ok(Envelope { id, body }) = postcard::from_bytes::<Envelope<TransferRequest>>(data) {
            let head = Head::encode(id, &body, 1 << 20).expect("every transfer request fits a stack head");
            let back: Envelope<TransferRequest> = postcard::from_bytes(&head.as_bytes()[FRAME_PREFIX..]).unwrap();
            assert_eq!((back.id, &back.body), (id, &body));
        }
    }
    // Client side: the id first, then the message after it.
    let frame = Frame { header: Bytes::copy_from_slice(data), payload: Bytes::new() };
    if let Ok((id, body)) = postcard::take_from_bytes::<u64>(data) {
        assert_eq!(frame.request_id().expect("the id decodes either way"), id);
        if let Ok(resp) = postcard::from_bytes::<TransferResponse>(body) {
            let again = reencodes_stably(id, &resp);
            assert_eq!(again.decode::<TransferResponse>().unwrap().body, resp);
        }
        if let Ok(e) = postcard::from_bytes::<ErrorFrame>(body) {
            let _ = e.to_string();
            let again = reencodes_stably(id, &e);
            assert_eq!(again.decode::<ErrorFrame>().unwrap().body, e);
        }
    } else {
        assert!(frame.request_id().is_err());
    }
});
